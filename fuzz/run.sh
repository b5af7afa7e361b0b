#!/usr/bin/env bash
# Fuzzes for SECONDS seconds in all (default 60), with AddressSanitizer, debug
# assertions and overflow checks, on the stable toolchain (RUSTC_BOOTSTRAP=1
# lets cargo-fuzz pass its nightly-only flags), one target after another:
# the ring's attach and `next` (attach_next) gets a third of the time, the
# remote listings' parsers (webdav_listing: a PROPFIND answer; s3_list_page:
# an S3 ListObjectsV2 page) and the image decode stage (decode_image: JPEG,
# PNG or WebP bytes to a cropped tensor, issue 30) two ninths each. Name targets to run only those, each
# for SECONDS.
#
#   bash fuzz/run.sh 60
#   bash fuzz/run.sh 60 webdav_listing
#
# A crash, or a run past 512 MB of memory (RSS, or one allocation), leaves
# its input in fuzz/artifacts/TARGET/ and exits non-zero;
# replay it with:
#   cd fuzz && RUSTC_BOOTSTRAP=1 cargo fuzz run TARGET artifacts/TARGET/crash-...
set -euo pipefail

seconds="${1:-60}"
shift || true
cd "$(dirname "$0")"

if ! command -v cargo-fuzz >/dev/null 2>&1; then
    cargo install cargo-fuzz --locked
fi

if [ "$#" -gt 0 ]; then
    plan=()
    for target in "$@"; do plan+=("$target:$seconds"); done
else
    share=$(( seconds * 2 / 9 ))
    plan=("attach_next:$(( seconds - 3 * share ))" "webdav_listing:$share" "s3_list_page:$share" "decode_image:$share")
fi

export RUSTC_BOOTSTRAP=1
# Every target runs under a memory limit (issue 36): a process past 512 MB,
# or one allocation past it, is a failure with its input saved, so an
# allocation bomb is found like a crash. AddressSanitizer's quarantine of
# freed blocks (256 MB by default) would count against it: keep it smaller.
RSS_LIMIT_MB=512
export ASAN_OPTIONS="${ASAN_OPTIONS:-quarantine_size_mb=64}"
for item in "${plan[@]}"; do
    target="${item%%:*}"; secs="${item##*:}"
    [ "$secs" -ge 1 ] || secs=1
    # fuzz/corpus is ignored by git: start it from the committed seeds, and
    # keep whatever earlier runs on this machine added.
    mkdir -p "corpus/$target"
    cp -n "seeds/$target"/* "corpus/$target/"
    echo "fuzz: $target for ${secs}s"
    cargo fuzz run "$target" "corpus/$target" -- \
        -max_total_time="$secs" -max_len=65536 -timeout=10 \
        -rss_limit_mb="$RSS_LIMIT_MB" -malloc_limit_mb="$RSS_LIMIT_MB" -print_final_stats=1
done
