#!/usr/bin/env bash
# The wheel as a user gets it (issue 31): build it from this checkout with the
# one documented command, install it into a fresh venv outside the checkout
# with no Rust on PATH, and from that venv only run `ringfeed --version`,
# `python -m ringfeed --version`, `ringfeed demo` (its exactly-once check)
# and `ringfeed run -- torchrun --nproc-per-node 2 examples/train_ddp.py`;
# then `pip uninstall -y ringfeed` must leave the venv as it was before.
#
#   bash tests/wheel/check.sh            # from tests/run.sh, after cargo build
#
# RINGFEED_WHEEL_PYTHON: the Python that builds the wheel and whose interpreter
# makes the fresh venv (default .venv/bin/python). The fresh venv gets the
# torch of that Python's environment (same version) and numpy, from
# RINGFEED_WHEELHOUSE when set (tests/run.sh sets it), else from the index:
# no --system-site-packages.
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
PY=${RINGFEED_WHEEL_PYTHON:-$ROOT/.venv/bin/python}
WORK=$(mktemp -d /tmp/ringfeed-wheel.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
say() { printf 'wheel check (%ds): %s\n' "$SECONDS" "$*"; }
fail() { printf 'wheel check FAILED: %s\n' "$*" >&2; exit 1; }

say "pip wheel --no-deps ./bindings/python -w DIST"
"$PY" -m pip wheel -q --no-deps ./bindings/python -w "$WORK/dist"
wheels=("$WORK"/dist/ringfeed-*.whl)
[ ${#wheels[@]} -eq 1 ] || fail "expected one wheel, got: ${wheels[*]}"
WHEEL=${wheels[0]}
say "built $(basename "$WHEEL"), $(du -k "$WHEEL" | cut -f1) KiB"

# The tag, worked out again here from the two binaries the wheel holds.
mkdir "$WORK/unpacked"
"$PY" -m zipfile -e "$WHEEL" "$WORK/unpacked"
LIB=$WORK/unpacked/ringfeed/libringfeed.so
BIN=$(echo "$WORK"/unpacked/ringfeed-*.data/scripts/ringfeed)
[ -f "$LIB" ] || fail "the wheel has no ringfeed/libringfeed.so"
[ -f "$BIN" ] || fail "the wheel has no ringfeed-*.data/scripts/ringfeed"
# Every module of the package, the ringfeed.tar submodule included.
for module in __init__ _batch _feed _handle _lib tar torch errors; do
    [ -f "$WORK/unpacked/ringfeed/$module.py" ] || fail "the wheel has no ringfeed/$module.py"
done
glibc=$(objdump -T "$LIB" "$BIN" | grep -o 'GLIBC_2\.[0-9]*' | sort -u -t. -k2,2n | tail -1)
want="manylinux_2_${glibc#GLIBC_2.}_$(uname -m)"
case "$(basename "$WHEEL")" in
    *-py3-none-"$want".whl) say "tag $want: the newest glibc symbol the binaries use is $glibc" ;;
    *) fail "$(basename "$WHEEL") is not tagged $want (newest symbol: $glibc)" ;;
esac

# A fresh venv outside the checkout; every step from here on runs with only
# the venv and /usr/bin:/bin on PATH, from $WORK, with none of the
# checkout's RINGFEED_* overrides. HOME and TMPDIR are fresh empty folders
# (pip's cache is kept apart), so that whatever the installed ringfeed
# writes outside the venv can be seen at the end.
BASE=$("$PY" -c 'import sys; print(sys._base_executable)')
VENV=$WORK/venv
mkdir "$WORK/home" "$WORK/tmp"
clean() {
    (cd "$WORK" && env -u RINGFEED_LIB -u RINGFEED_BIN -u RINGFEED_LIB_DIR -u PYTHONPATH -u VIRTUAL_ENV \
        -u CARGO_HOME -u RUSTUP_HOME -u RINGFEED_CACHE_DIR -u XDG_CACHE_HOME -u XDG_CONFIG_HOME \
        -u XDG_DATA_HOME -u XDG_RUNTIME_DIR HOME="$WORK/home" TMPDIR="$WORK/tmp" \
        PIP_CACHE_DIR="$WORK/pip-cache" PATH="$VENV/bin:/usr/bin:/bin" OMP_NUM_THREADS=1 "$@")
}
"$BASE" -m venv "$VENV"
if clean sh -c 'command -v cargo || command -v rustc'; then fail "Rust is on the clean PATH"; fi
torch_version=$("$PY" -c 'from importlib import metadata; print(metadata.version("torch"))')
t=$SECONDS
if [ -n "${RINGFEED_WHEELHOUSE:-}" ]; then
    # tests/run.sh's wheelhouse: the same wheels the index gave .venv, no download.
    say "fresh venv; pip install torch==$torch_version numpy from $RINGFEED_WHEELHOUSE"
    clean python -m pip install -q --disable-pip-version-check --no-compile --no-index \
        --find-links "$RINGFEED_WHEELHOUSE" "torch==$torch_version" numpy
else
    say "fresh venv; pip install torch==$torch_version numpy"
    clean python -m pip install -q --disable-pip-version-check --no-compile "torch==$torch_version" numpy
fi
say "torch installed in $((SECONDS - t))s"
(cd "$VENV" && find . | sort) >"$WORK/before"

say "pip install $(basename "$WHEEL")"
clean python -m pip install -q --disable-pip-version-check "$WHEEL"
[ "$(clean sh -c 'command -v ringfeed')" = "$VENV/bin/ringfeed" ] || fail "ringfeed is not the venv's bin/ringfeed"

version=$(clean python -c 'from importlib import metadata; print(metadata.version("ringfeed"))')
cargo_version=$(clean python - "$ROOT/Cargo.toml" <<'EOF'
import sys, tomllib
print(tomllib.load(open(sys.argv[1], "rb"))["workspace"]["package"]["version"])
EOF
)
[ "$version" = "$cargo_version" ] || fail "package version $version, Cargo.toml's $cargo_version"
out=$(clean ringfeed --version)
[ "$out" = "ringfeed $version" ] || fail "ringfeed --version says '$out', the package is $version"
out=$(clean python -m ringfeed --version)
[ "$out" = "ringfeed $version" ] || fail "python -m ringfeed --version says '$out', the package is $version"
out=$(clean python -c 'import ringfeed; print(ringfeed.__version__, ringfeed.library_path)')
[ "$out" = "$version $VENV/lib/python3.$("$BASE" -c 'import sys; print(sys.version_info[1])')/site-packages/ringfeed/libringfeed.so" ] \
    || fail "ringfeed.__version__ and library_path: '$out' (want $version and the bundled library)"
out=$(clean env RINGFEED_LIB="$LIB" python -c 'import ringfeed; print(ringfeed.library_path)')
[ "$out" = "$LIB" ] || fail "RINGFEED_LIB=$LIB did not win over the bundled library: $out"
say "ringfeed --version, python -m ringfeed --version, ringfeed.__version__: $version; RINGFEED_LIB wins"

say "ringfeed demo"
clean ringfeed demo >"$WORK/demo.log" 2>&1 || { cat "$WORK/demo.log"; fail "ringfeed demo"; }
grep -q "exactly-once check passed" "$WORK/demo.log" || { cat "$WORK/demo.log"; fail "ringfeed demo did not pass its check"; }
demo_name=$(sed -n 's/.*\/dev\/shm\/ringfeed-\(demo-[0-9]*\).*/\1/p' "$WORK/demo.log" | head -1)
[ -n "$demo_name" ] || { cat "$WORK/demo.log"; fail "no loader name in ringfeed demo's output"; }

say "ringfeed run -- torchrun --standalone --nproc-per-node 2 examples/train_ddp.py"
mkdir "$WORK/data"
for shard in 0 1 2; do head -c $((256 * 100)) /dev/urandom >"$WORK/data/shard-$shard.bin"; done
# Older than the manifest cache's 2 s guard (ctime), as a user's dataset is:
# its listing is cached, in HOME (checked after the uninstall).
sleep 3
t=$SECONDS
clean timeout 300 ringfeed run --source "$WORK/data" --batch-size 4 --record-bytes 256 --epochs 2 \
    -- torchrun --standalone --nproc-per-node 2 "$ROOT/examples/train_ddp.py" >"$WORK/run.log" 2>&1 \
    || { cat "$WORK/run.log"; fail "ringfeed run -- torchrun"; }
grep -q "ringfeed: done: 148 batches, 592 samples" "$WORK/run.log" && grep -q "epoch 1 step 20 loss" "$WORK/run.log" \
    || { cat "$WORK/run.log"; fail "ringfeed run -- torchrun did not train both epochs"; }
name=$(sed -n 's/.*ringfeed run: loader "\([^"]*\)".*/\1/p' "$WORK/run.log" | head -1)
[ -n "$name" ] || { cat "$WORK/run.log"; fail "no loader name in ringfeed run's output"; }
for loader in "$name" "$demo_name"; do
    if compgen -G "/dev/shm/*$loader*" >/dev/null; then fail "the loader left $(echo /dev/shm/*"$loader"*)"; fi
done
say "torchrun trained 2 epochs from the ring in $((SECONDS - t))s; loaders $demo_name and $name left nothing in /dev/shm"

say "pip uninstall -y ringfeed"
clean python -m pip uninstall -q -y ringfeed
(cd "$VENV" && find . | sort) >"$WORK/after"
diff -u "$WORK/before" "$WORK/after" || fail "pip uninstall left the files above in the venv"
# Outside the venv: in HOME only ringfeed's cache directory, the cached
# listing of the run's --source (~/.cache/ringfeed/manifests/ID.manifest),
# which pip uninstall keeps as it keeps pip's own cache (docs/install.md says
# so and how to remove it); nothing in TMPDIR but torchrun's own leftovers
# (torchelastic_*, torchinductor_USER); /dev/shm was checked above.
(cd "$WORK" && find home tmp -mindepth 1 | sort) >"$WORK/outside"
grep -v -x -e 'home/.cache' -e 'home/.cache/ringfeed' -e 'home/.cache/ringfeed/manifests' \
    -e 'home/.cache/ringfeed/manifests/[0-9a-f]*\.manifest' -e 'tmp/torchelastic_[^/]*\(/.*\)\{0,1\}' \
    -e 'tmp/torchinductor_[^/]*\(/.*\)\{0,1\}' "$WORK/outside" >"$WORK/stray" || true
[ ! -s "$WORK/stray" ] || { cat "$WORK/stray"; fail "the files above were left outside the venv (in HOME or TMPDIR)"; }
cached=$(grep -c '^home/.cache/ringfeed/manifests/.*\.manifest$' "$WORK/outside" || true)
[ "$cached" = 1 ] || fail "expected the run's one cached manifest in ~/.cache/ringfeed/manifests, found $cached"
say "wheel check passed: uninstall left the venv as before ($(wc -l <"$WORK/after") entries), and outside it only the run's cached manifest in ~/.cache/ringfeed (nothing in TMPDIR or /dev/shm)"
