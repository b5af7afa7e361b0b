#!/usr/bin/env python3
"""Listing benchmark against a server whose only cost is latency (issue 29, point 3):
prints figures, never asserts.

    cargo build --release -p ringfeed --bin ringfeed --example remote_list
    .venv/bin/python bench/list_bench.py                       # 1M keys, 20 ms, every shape
    .venv/bin/python bench/list_bench.py --keys 200000 --shapes seq,hex --ttfb-shape none

For each key shape of tests/servers/listserver.py (sequential numbers, hex hashes,
nested prefixes, skewed prefixes) it lists `s3://list/data/` with one sequential paginated
listing and with the parallel listing (`examples/remote_list`, which also checks that the
two are identical), and prints keys/s, the speedup, the requests the server answered and
the most it had in flight, the CPU seconds of the client and of the server, and the keys
the server's pages held (each is parsed by the client: the parallel listing's waste). Then the time to first batch of `ringfeed serve` over an
uncached listing of the same prefix (--manifest-cache off --cache off), one consumer.
The server, the loader and the consumer share this machine's cores: the server's CPU per
page is a join of pre-made XML, so the delay is what a listing waits on.
"""
import argparse
import json
import os
import re
import resource
import subprocess
import sys
import time
import urllib.request
import uuid

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SERVER = os.path.join(REPO, "tests", "servers", "listserver.py")


def start_server(shape, keys, delay_ms):
    proc = subprocess.Popen([sys.executable, SERVER, "--keys", str(keys), "--shape", shape, "--delay-ms", str(delay_ms)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    line = proc.stdout.readline()
    m = re.search(r"127\.0\.0\.1:(\d+)", line)
    if not m:
        proc.kill()
        raise SystemExit("list_bench: listserver did not start: %r" % line)
    return proc, int(m.group(1))


def env_for(port):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "AZURE_", "GOOGLE_"))}
    env.update(AWS_ENDPOINT_URL="http://127.0.0.1:%d" % port, AWS_ALLOW_HTTP="true", AWS_ACCESS_KEY_ID="bench",
               AWS_SECRET_ACCESS_KEY="benchsecret", AWS_REGION="us-east-1", AWS_EC2_METADATA_DISABLED="true")
    return env


def cpu_s(pid):
    """utime + stime of a live process, in seconds (/proc/PID/stat)."""
    with open("/proc/%d/stat" % pid) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def children_cpu_s():
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def stats(port):
    with urllib.request.urlopen("http://127.0.0.1:%d/_stats" % port, timeout=10) as r:
        return json.loads(r.read())


def list_once(args, shape, mode):
    """One listing, sequential or parallel, on a fresh server (so its counters are this run's)."""
    proc, port = start_server(shape, args.keys, args.delay_ms)
    try:
        cmd = [os.path.join(args.target, "examples", "remote_list"), "s3://list/data/", "--workers", str(args.workers),
               "--skip-parallel" if mode == "seq" else "--skip-sequential"]
        server_before, client_before = cpu_s(proc.pid), children_cpu_s()
        run = subprocess.run(cmd, env=env_for(port), capture_output=True, text=True, timeout=3600)
        cpu = {"client": children_cpu_s() - client_before, "server": cpu_s(proc.pid) - server_before}
        if run.returncode != 0:
            raise SystemExit("list_bench: %s failed:\n%s" % (" ".join(cmd), run.stderr[-2000:]))
        m = re.search(r"(\d+) keys in ([0-9.]+) s", run.stdout)
        return int(m.group(1)), float(m.group(2)), dict(stats(port), **cpu)
    finally:
        proc.kill()
        proc.wait()


def identical(args, shape):
    """Both listings in one run of remote_list, which fails if they differ."""
    proc, port = start_server(shape, args.keys, 0)
    try:
        cmd = [os.path.join(args.target, "examples", "remote_list"), "s3://list/data/", "--workers", str(args.workers)]
        run = subprocess.run(cmd, env=env_for(port), capture_output=True, text=True, timeout=3600)
        return run.returncode == 0 and "identical listings" in run.stdout
    finally:
        proc.kill()
        proc.wait()


def ttfb(args, shape):
    """Seconds from `ringfeed serve` starting on an uncached listing to a consumer's first batch."""
    proc, port = start_server(shape, args.keys, args.delay_ms)
    name = "listbench-%s" % uuid.uuid4().hex[:8]
    env = env_for(port)
    env["RINGFEED_LIB"] = os.path.join(args.target, "libringfeed.so")
    env["PYTHONPATH"] = os.path.join(REPO, "bindings", "python")
    serve = None
    try:
        t0 = time.monotonic()
        serve = subprocess.Popen([os.path.join(args.target, "ringfeed"), "serve", "--source", "s3://list/data/",
                                  "--name", name, "--batch-size", "64", "--manifest-cache", "off", "--cache", "off"],
                                 env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        consumer = subprocess.run([sys.executable, "-c", (
            "import ringfeed, time\n"
            "feed = ringfeed.attach(%r, 0, timeout=3600)\n"
            "b = next(iter(feed)); print(len(b)); b.release()\n") % name],
            env=env, capture_output=True, text=True, timeout=3600)
        took = time.monotonic() - t0
        if consumer.returncode != 0:
            raise SystemExit("list_bench: the consumer failed:\n%s" % consumer.stderr[-2000:])
        return took
    finally:
        if serve is not None:
            serve.terminate()
            try:
                serve.wait(timeout=30)
            except subprocess.TimeoutExpired:
                serve.kill()
        proc.kill()
        proc.wait()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--keys", type=int, default=1_000_000)
    ap.add_argument("--delay-ms", type=float, default=20.0)
    ap.add_argument("--workers", type=int, default=64)
    ap.add_argument("--shapes", default="seq,hex,nested,skewed")
    ap.add_argument("--ttfb-shape", default="hex", help="shape for the time to first batch, or none")
    ap.add_argument("--target", default=os.path.join(REPO, "target", "release"))
    ap.add_argument("--skip-identical", action="store_true", help="skip the run that checks both listings agree")
    args = ap.parse_args()
    print("listing %d keys at %.0f ms per request, %d workers; load average %s; client CPU is user + system seconds of examples/remote_list, server CPU that of listserver.py"
          % (args.keys, args.delay_ms, args.workers, " ".join("%.1f" % x for x in os.getloadavg())))
    print("| shape | sequential s | keys/s | parallel s | keys/s | speedup | requests seq/par | in flight max | identical "
          "| client CPU s seq/par | server CPU s seq/par | keys in pages seq/par |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for shape in args.shapes.split(","):
        n1, s1, st1 = list_once(args, shape, "seq")
        n2, s2, st2 = list_once(args, shape, "par")
        same = n1 == n2 == args.keys and (None if args.skip_identical else identical(args, shape))
        print("| %s | %.2f | %.0f | %.2f | %.0f | %.1fx | %d / %d | %d | %s | %.2f / %.2f | %.2f / %.2f | %s / %s |" % (
            shape, s1, n1 / s1, s2, n2 / s2, s1 / s2, st1["requests"], st2["requests"], st2["in_flight_max"],
            {True: "yes", None: "not checked"}.get(same, "NO"), st1["client"], st2["client"], st1["server"], st2["server"],
            st1.get("keys_returned", "-"), st2.get("keys_returned", "-")), flush=True)
    if args.ttfb_shape != "none":
        print("time to first batch, `ringfeed serve` over an uncached listing of %d keys (%s): %.1f s"
              % (args.keys, args.ttfb_shape, ttfb(args, args.ttfb_shape)))


if __name__ == "__main__":
    main()
