#!/usr/bin/env bash
# Fuzzes the ring's attach and `next` for SECONDS seconds (default 60), with
# AddressSanitizer, debug assertions and overflow checks, on the stable
# toolchain (RUSTC_BOOTSTRAP=1 lets cargo-fuzz pass its nightly-only flags).
#
#   bash fuzz/run.sh 60
#
# A crash leaves its input in fuzz/artifacts/attach_next/ and exits non-zero;
# replay it with:
#   cd fuzz && RUSTC_BOOTSTRAP=1 cargo fuzz run attach_next artifacts/attach_next/crash-...
set -euo pipefail

seconds="${1:-60}"
cd "$(dirname "$0")"

if ! command -v cargo-fuzz >/dev/null 2>&1; then
    cargo install cargo-fuzz --locked
fi

# fuzz/corpus is ignored by git: start it from the committed seeds, and keep
# whatever earlier runs on this machine added.
mkdir -p corpus/attach_next
cp -n seeds/attach_next/* corpus/attach_next/

export RUSTC_BOOTSTRAP=1
cargo fuzz run attach_next corpus/attach_next -- \
    -max_total_time="$seconds" -max_len=65536 -timeout=10 -rss_limit_mb=2048 -print_final_stats=1
