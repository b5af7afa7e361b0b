#!/usr/bin/env python3
"""Time to first batch with a remote prefix's listing in the manifest cache
(issue 21, point 5): prints figures, never asserts.

    cargo build --release -p ringfeed --bin ringfeed -p faultproxy -p ringfeed-ffi
    /work/venv/bin/python bench/remote_ttfb.py --objects 100000

nginx (WebDAV, tests/servers/servers.sh) behind tests/faultproxy adding 20 ms
per round trip; OBJECTS files of 1 KiB in directories of 1,000. A first
`ringfeed serve --source http://PROXY/set/` lists the prefix (PROPFIND walk)
and stores the listing in a fresh cache directory; then --runs starts from
the cache, each timed from the serve process's launch to the first batch a
Python rank receives (batch 64, one rank). The background re-list that each
cached start makes runs beside it.
"""

import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "bench"))
from remote_bench import load_env, start_proxy, SERVERS_SH  # noqa: E402

OBJECT_BYTES = 1024
PER_DIR = 1000
BATCH = 64


def seed(root, objects):
    payload = os.urandom(OBJECT_BYTES)
    for i in range(objects):
        d = os.path.join(root, "d%04d" % (i // PER_DIR))
        if i % PER_DIR == 0:
            os.makedirs(d, exist_ok=True)
        with open(os.path.join(d, "f%06d.bin" % i), "wb") as f:
            f.write(payload)


def first_batch(bin_path, url, env, lib):
    """(seconds from launch to the first batch, the loader's log)."""
    name = "ttfb%d" % os.getpid()
    t0 = time.time()
    serve = subprocess.Popen([bin_path, "serve", "--source", url, "--name", name, "--batch-size", str(BATCH),
                              "--world-size", "1", "--epochs", "1"], stderr=subprocess.PIPE, text=True, env=env)
    lines = []
    reader = threading.Thread(target=lambda: lines.extend(l.rstrip("\n") for l in serve.stderr), daemon=True)
    reader.start()
    os.environ["RINGFEED_LIB"] = lib
    import ringfeed

    try:
        feed = ringfeed.attach(name, 0, timeout=600)
        b = feed.next(timeout=600)
        secs = time.time() - t0
        b.release()
        feed.close()
    finally:
        serve.send_signal(signal.SIGTERM)
        try:
            serve.wait(timeout=30)
        except subprocess.TimeoutExpired:
            serve.kill()
            serve.wait()
        reader.join(timeout=2)
    return secs, lines


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--objects", type=int, default=100_000)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--target", default=os.path.join(REPO, "target", "release"))
    args = ap.parse_args()
    sys.path.insert(0, os.path.join(REPO, "bindings", "python"))
    lib = os.path.join(args.target, "libringfeed.so")
    state = tempfile.mkdtemp(prefix="rf-ttfb-")
    proxy = None
    try:
        subprocess.run([SERVERS_SH, "start", "nginx", state], check=True, stdout=subprocess.DEVNULL)
        env = load_env(os.path.join(state, "nginx.env"))
        seed(os.path.join(env["RINGFEED_TEST_NGINX_ROOT"], "set"), args.objects)
        upstream = env["RINGFEED_TEST_NGINX_URL"].rstrip("/").split("://", 1)[1]
        proxy, port = start_proxy(args.target, upstream, state, "ttfb")
        url = "http://127.0.0.1:%d/set/" % port
        run_env = dict(os.environ, RINGFEED_CACHE_DIR=os.path.join(state, "cache"))
        bin_path = os.path.join(args.target, "ringfeed")
        print("command: %s serve --source %s --name NAME --batch-size %d --world-size 1 --epochs 1"
              % (bin_path, url, BATCH))
        secs, log = first_batch(bin_path, url, run_env, lib)
        manifest = [l for l in log if "manifest:" in l]
        print("listed start:  first batch after %.2f s  (%s)" % (secs, manifest[-1] if manifest else log[-3:]))
        for run in range(args.runs):
            secs, log = first_batch(bin_path, url, run_env, lib)
            manifest = [l for l in log if "manifest:" in l]
            print("cached start %d: first batch after %.3f s  (%s)" % (run + 1, secs, manifest[-1] if manifest else log[-3:]))
    finally:
        if proxy is not None:
            proxy.terminate()
            proxy.wait()
        subprocess.run([SERVERS_SH, "stop", "nginx", state], stdout=subprocess.DEVNULL)
        shutil.rmtree(state, ignore_errors=True)


if __name__ == "__main__":
    main()
