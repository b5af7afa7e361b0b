#!/usr/bin/env bash
# Brings up every server the remote-source tests need, on 127.0.0.1, and
# stops them (by pid) when the caller exits.
#
# Sourced (tests/run.sh):   source tests/servers/up.sh
#     installs what is missing, starts the servers, exports their environment
#     (see tests/servers/README.md) and sets an EXIT trap that stops them.
# Run:                      tests/servers/up.sh COMMAND [ARGS...]
#     runs COMMAND with the servers up and their environment set, stops them,
#     and exits with COMMAND's status.
#
# RINGFEED_SERVERS="s3 nginx" limits which servers (default: all five).
# The state (data, logs, pids, env files) is in $RINGFEED_SERVERS_STATE, a
# temporary directory removed at the end unless RINGFEED_SERVERS_KEEP=1.

_rf_servers_dir=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
_rf_servers_list=${RINGFEED_SERVERS:-s3 nginx rclone azurite gcs}

ringfeed_servers_down() {
    local name
    for name in $_rf_servers_list; do
        bash "$_rf_servers_dir/servers.sh" stop "$name" "$RINGFEED_SERVERS_STATE" || true
    done
    if [ "${RINGFEED_SERVERS_KEEP:-0}" != 1 ]; then
        rm -rf "$RINGFEED_SERVERS_STATE"
    fi
}

ringfeed_servers_up() {
    local name started=$SECONDS
    RINGFEED_SERVERS_STATE=$(mktemp -d "${TMPDIR:-/tmp}/ringfeed-servers.XXXXXX")
    export RINGFEED_SERVERS_STATE
    # Installed before the trap is set and the first server starts, so that a
    # failed install leaves nothing running.
    # shellcheck disable=SC2086
    bash "$_rf_servers_dir/servers.sh" install $_rf_servers_list || return 1
    echo "servers: installed in $((SECONDS - started)) s" >&2
    trap ringfeed_servers_down EXIT
    # A signal becomes an exit, so that the EXIT trap stops the servers then too.
    trap 'exit 130' INT
    trap 'exit 143' TERM
    started=$SECONDS
    for name in $_rf_servers_list; do
        bash "$_rf_servers_dir/servers.sh" start "$name" "$RINGFEED_SERVERS_STATE" >/dev/null || return 1
        # shellcheck disable=SC1090
        source "$RINGFEED_SERVERS_STATE/$name.env"
    done
    echo "servers: $_rf_servers_list up in $((SECONDS - started)) s (state in $RINGFEED_SERVERS_STATE)" >&2
}

if [ "${BASH_SOURCE[0]}" != "$0" ]; then
    ringfeed_servers_up || { echo "servers: could not bring the servers up (see above)" >&2; return 1; }
else
    set -euo pipefail
    [ $# -ge 1 ] || { echo "usage: source tests/servers/up.sh, or tests/servers/up.sh COMMAND [ARGS...]" >&2; exit 2; }
    ringfeed_servers_up
    status=0
    "$@" || status=$?
    exit $status
fi
