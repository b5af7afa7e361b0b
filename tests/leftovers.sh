#!/usr/bin/env bash
# Fails, naming them, if processes a test run started are still running:
# those whose command line, working directory, an open file or an
# environment variable is under one of DIR... (the run's temporary
# directories: tests/run.sh points TMPDIR there, so pytest's tmp_path, the
# servers' state and the loaders' sources all live under it, and every
# process the run starts inherits TMPDIR: a loader of a remote URL, run
# from the checkout, names nothing under DIR but its environment). Every
# server or loader a test starts must be stopped by that test's teardown.
#
#   tests/leftovers.sh DIR...
set -uo pipefail
[ $# -ge 1 ] || { echo "usage: tests/leftovers.sh DIR..." >&2; exit 2; }
roots=()
for root in "$@"; do
    roots+=("$(cd "$root" 2>/dev/null && pwd -P || echo "$root")")
done

# This script and its ancestors (the run itself) are not leftovers.
mine=" "
p=$$
while [ "${p:-0}" -gt 1 ]; do
    mine+="$p "
    p=$(awk '/^PPid:/ { print $2 }' "/proc/$p/status" 2>/dev/null)
done

# Where PID (its /proc directory: $1) touches a root, or nothing.
touches() {
    local dir=$1 cmd=$2 root cwd fd target
    for root in "${roots[@]}"; do
        case "$cmd " in *"$root"/* | *"$root "*) echo "its command line names $root"; return ;; esac
        cwd=$(readlink "$dir/cwd" 2>/dev/null) || cwd=""
        case "$cwd/" in "$root"/*) echo "it runs in $cwd"; return ;; esac
        for fd in "$dir"/fd/*; do
            target=$(readlink "$fd" 2>/dev/null) || continue
            case "$target" in "$root"/*) echo "it holds $target open"; return ;; esac
        done
        # VAR=ROOT or VAR=ROOT/...: each variable given a trailing / first.
        if { tr '\0' '\n' <"$dir/environ"; } 2>/dev/null | sed 's|$|/|' | grep -qF -- "=$root/"; then
            echo "its environment names $root"
            return
        fi
    done
}

left=0
for dir in /proc/[0-9]*; do
    pid=${dir#/proc/}
    case "$mine" in *" $pid "*) continue ;; esac
    cmd=$({ tr '\0' ' ' <"$dir/cmdline"; } 2>/dev/null) || continue
    [ -n "$cmd" ] || continue # a kernel thread, or gone
    why=$(touches "$dir" "$cmd")
    [ -n "$why" ] || continue
    echo "leftovers: pid $pid is still running ($why): ${cmd:0:300}" >&2
    left=$((left + 1))
done
if [ "$left" -gt 0 ]; then
    echo "leftovers: $left process(es) started by the tests outlived them: stop each in the teardown of the test that starts it" >&2
    exit 1
fi
echo "leftovers: no process of the run is left" >&2
