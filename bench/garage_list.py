#!/usr/bin/env python3
"""Listing benchmark against Garage (issue 21, point 5): prints figures, never asserts.

    cargo build --release -p ringfeed --example remote_list -p faultproxy
    tests/servers/servers.sh install garage          # cargo install, ~15 min on 2 cores
    /work/venv/bin/python bench/garage_list.py --keys 100000

s3s-fs walks its whole bucket directory for every listing page, so its page
cost grows with the bucket and hides what parallel listing gains; Garage
(a distributed S3 server, metadata in LMDB) answers a page from an ordered
index, as S3 does. One node on 127.0.0.1, behind tests/faultproxy adding
20 ms per round trip. KEYS one-byte objects `k/obj-NNNNNN` are PUT once
(boto3, a thread pool) into a state directory kept between runs (--state).
Then examples/remote_list lists `s3://BUCKET/k/` sequentially (one paginated
listing) and in parallel (--workers), each alone with the server's and the
proxy's CPU beside it, and once both together to check they are identical.
"""

import argparse
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "bench"))
from remote_bench import CpuMeter, SERVERS_SH, load_env, start_proxy  # noqa: E402


def seed(env, bucket, keys, threads=32):
    import boto3
    from botocore.config import Config

    s3 = boto3.client("s3", endpoint_url=env["AWS_ENDPOINT_URL"], region_name=env["AWS_REGION"],
                      aws_access_key_id=env["AWS_ACCESS_KEY_ID"], aws_secret_access_key=env["AWS_SECRET_ACCESS_KEY"],
                      config=Config(max_pool_connections=threads, retries={"max_attempts": 10}))
    have = s3.list_objects_v2(Bucket=bucket, Prefix="k/obj-%06d" % (keys - 1)).get("KeyCount", 0)
    if have:
        return 0.0
    t = time.time()
    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(lambda i: s3.put_object(Bucket=bucket, Key="k/obj-%06d" % i, Body=b"x"), range(keys)))
    return time.time() - t


def timed(cmd, env, meter):
    before = meter.snap()
    t0 = time.time()
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=1800)
    wall = time.time() - t0
    cpu = CpuMeter.cores(before, meter.snap(), wall)
    return (p.stdout + p.stderr).strip(), p.returncode, wall, cpu


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--keys", type=int, default=100_000)
    ap.add_argument("--workers", type=int, default=64)
    ap.add_argument("--rtt-ms", type=int, default=20)
    ap.add_argument("--state", default="/tmp/rf-garage-bench")
    ap.add_argument("--target", default=os.path.join(REPO, "target", "release"))
    args = ap.parse_args()
    os.makedirs(args.state, exist_ok=True)
    subprocess.run([SERVERS_SH, "start", "garage", args.state], check=True, stdout=subprocess.DEVNULL)
    proxy = None
    try:
        env = load_env(os.path.join(args.state, "garage.env"))
        with open(os.path.join(args.state, "garage.pid")) as f:
            garage_pid = int(f.read().strip())
        bucket = env["RINGFEED_TEST_GARAGE_BUCKET"]
        took = seed(env, bucket, args.keys)
        if took:
            print("seeded %d keys in %.1f s" % (args.keys, took))
        upstream = env["AWS_ENDPOINT_URL"].split("://", 1)[1]
        import remote_bench

        remote_bench.RTT_MS = args.rtt_ms
        # A port file of an earlier run would be read as this proxy's.
        port_file = os.path.join(args.state, "proxy-list.port")
        if os.path.exists(port_file):
            os.remove(port_file)
        proxy, port = start_proxy(args.target, upstream, args.state, "list")
        run_env = dict(os.environ, **env)
        run_env["AWS_ENDPOINT_URL"] = "http://127.0.0.1:%d" % port
        meter = CpuMeter({"server": lambda: [garage_pid], "proxy": lambda: [proxy.pid]})
        lister = os.path.join(args.target, "examples", "remote_list")
        url = "s3://%s/k/" % bucket
        print("garage 2.5.0, one node, behind faultproxy --rtt-ms %d; %d keys; load %.1f"
              % (args.rtt_ms, args.keys, os.getloadavg()[0]))
        for what, flags in (("sequential", ["--skip-parallel"]), ("parallel", ["--skip-sequential"]),
                            ("both, checked identical", [])):
            cmd = [lister, url, "--workers", str(args.workers)] + flags
            text, rc, wall, cpu = timed(cmd, run_env, meter)
            print("%-24s rc %d, %.2f s: %s | server %.2f cores, proxy %.2f cores"
                  % (what, rc, wall, text.replace("\n", "; "), cpu["server"], cpu["proxy"]))
        print("command: AWS_ENDPOINT_URL=http://127.0.0.1:PROXY %s %s --workers %d" % (lister, url, args.workers))
    finally:
        if proxy is not None:
            proxy.terminate()
            proxy.wait()
        subprocess.run([SERVERS_SH, "stop", "garage", args.state], stdout=subprocess.DEVNULL)


if __name__ == "__main__":
    main()
