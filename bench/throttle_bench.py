#!/usr/bin/env python3
"""Many loaders, one store (issue 40, items 1 and 2): prints figures, never asserts.

    cargo build --release -p ringfeed --bin ringfeed -p ringfeed-ffi -p faultproxy
    /work/venv/bin/python bench/throttle_bench.py                       # this build
    /work/venv/bin/python bench/throttle_bench.py --base /work/base-bin # and a build before, beside it

nginx (WebDAV, one worker) behind tests/faultproxy adding a 10 ms round trip,
2,400 objects of 8 KiB. Scenarios (--only):
  throttle   three loaders started together against one token bucket of
             --rates GETs/s (default 1200 and 600; the proxy answers the rest
             503 SlowDown after one round trip, as S3 throttles a prefix):
             goodput (GETs the store served per second, over the span from the
             first request to the last, and over the whole run from the
             loaders' start to the last exit) against the rate, requests per
             object served, every object exactly once per loader.
  hold       one loader, an epoch of the 2,400 objects: clean, then with 2% of
             the responses held 2 s before their body (--stall 0.02
             --stall-ms 2000): the epoch (start to the last batch) and the
             requests, against the clean ones.
Each loader is `ringfeed serve --source http://PROXY/set/ --cache off
--manifest-cache off --batch-size 48` (50 batches) with one Python rank reading every
sample (tests/python/procs/stamp_consumer.py). The load average is printed
beside each figure: the machine is shared, and so is its CPU with nginx and
the proxy (see bench/RESULTS-throttle.md for how to read it).
"""

import argparse
import datetime
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "tests", "python"))
import throttle_util as tu  # noqa: E402

SERVERS_SH = os.path.join(REPO, "tests", "servers", "servers.sh")
OBJECTS = 2400
OBJECT_BYTES = 8192
RTT_MS = 10
LOADERS = 3


def log(msg):
    print("[throttle_bench %s] %s" % (time.strftime("%H:%M:%S"), msg), file=sys.stderr, flush=True)


def load_env(path):
    import shlex

    env = {}
    with open(path) as f:
        for line in f:
            line = line.strip()
            if line.startswith("export "):
                for tok in shlex.split(line[len("export "):]):
                    k, _, v = tok.partition("=")
                    env[k] = v
    return env


def loadavg():
    return os.getloadavg()[0]


def throttle_cell(build, rate, nginx, state, crcs, runs):
    rows = []
    for run in range(runs):
        proxy = tu.Proxy(build["faultproxy"], nginx, ["--rtt-ms", str(RTT_MS), "--rate", str(rate)], state)
        load = loadavg()
        try:
            url = "http://127.0.0.1:%d/set/" % proxy.port
            result = tu.run_loaders(build["ringfeed"], build["lib"], url, LOADERS)
            c = proxy.counters()
        finally:
            proxy.stop()
        wrong = tu.check_exactly_once(result, crcs)
        served = c["requests"] - c["rate_limited"]
        span = (proxy.last_request - proxy.first_request) if proxy.first_request else float("nan")
        rows.append({
            "build": build["name"], "rate": rate, "run": run, "load": load, "secs": result["secs"], "span": span,
            "requests": c["requests"], "refused": c["rate_limited"], "served": served,
            "goodput_span": served / span / rate * 100, "goodput_run": served / result["secs"] / rate * 100,
            "per_object": c["requests"] / (LOADERS * OBJECTS), "ok": "yes" if not wrong else "NO: " + wrong[0][:200],
        })
        r = rows[-1]
        log("%s %d/s run %d: %.2f s (span %.2f s), goodput %.1f%% of the rate (%.1f%% over the run), "
            "%.3f requests per object, %d refused, exactly once: %s, load %.1f" % (
                build["name"], rate, run, r["secs"], span, r["goodput_span"], r["goodput_run"], r["per_object"],
                r["refused"], r["ok"], load))
    return rows


def hold_cell(build, nginx, state, crcs, runs, hold_fraction, hold_ms, seed):
    rows = []
    for run in range(runs):
        for kind, flags in (("clean", []), ("held", ["--stall", str(hold_fraction), "--stall-ms", str(hold_ms),
                                                     "--methods", "GET", "--seed", str(seed + run)])):
            proxy = tu.Proxy(build["faultproxy"], nginx, ["--rtt-ms", str(RTT_MS)] + flags, state)
            load = loadavg()
            try:
                url = "http://127.0.0.1:%d/set/" % proxy.port
                result = tu.run_loaders(build["ringfeed"], build["lib"], url, 1, metrics=True)
                c = proxy.counters()
            finally:
                proxy.stop()
            wrong = tu.check_exactly_once(result, crcs)
            l0 = result["loaders"][0]
            rows.append({
                "build": build["name"], "kind": kind, "run": run, "load": load, "secs": result["secs"],
                "epoch": l0["done_s"], "first": l0["first_batch_s"], "requests": c["requests"], "stalls": c["stalls"],
                "hedges": tu.scraped(l0["scrape"], "ringfeed_remote_hedges_total"),
                "won": tu.scraped(l0["scrape"], "ringfeed_remote_hedges_won_total"),
                "ok": "yes" if not wrong else "NO: " + wrong[0][:200],
            })
            r = rows[-1]
            log("%s %s run %d: epoch %.2f s (process %.2f s), %d requests, %d held, hedges %s (%s won), "
                "exactly once: %s, load %.1f" % (build["name"], kind, run, r["epoch"] or float("nan"), r["secs"],
                                                 r["requests"], r["stalls"], r["hedges"], r["won"], r["ok"], load))
    return rows


def build_of(name, bin_dir, faultproxy):
    ringfeed = os.path.join(bin_dir, "ringfeed")
    lib = os.path.join(bin_dir, "libringfeed.so")
    for p in (ringfeed, lib, faultproxy):
        if not os.path.exists(p):
            sys.exit("throttle_bench: %s is missing: build it (see the top of this file)" % p)
    return {"name": name, "ringfeed": ringfeed, "lib": lib, "faultproxy": faultproxy}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bin", default=os.path.join(REPO, "target", "release"),
                    help="directory of ringfeed and libringfeed.so (this build)")
    ap.add_argument("--base", help="directory of a build to compare (e.g. /work/base-bin)")
    ap.add_argument("--rates", default="1200,600")
    ap.add_argument("--runs", type=int, default=1)
    ap.add_argument("--only", default="throttle,hold")
    ap.add_argument("--hold-fraction", type=float, default=0.02)
    ap.add_argument("--hold-ms", type=int, default=2000)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--results", help="also write the tables to this file")
    args = ap.parse_args()
    faultproxy = os.path.join(REPO, "target", "release", "faultproxy")
    builds = [build_of("this", args.bin, faultproxy)]
    if args.base:
        builds.insert(0, build_of("base", args.base, faultproxy))
    state = tempfile.mkdtemp(prefix="rfthrottle-")
    t0 = time.time()
    try:
        subprocess.run([SERVERS_SH, "start", "nginx", state], check=True, stdout=subprocess.DEVNULL)
        env = load_env(os.path.join(state, "nginx.env"))
        nginx = env["RINGFEED_TEST_NGINX_URL"].split("//")[1].rstrip("/")
        crcs = tu.seed_objects(env["RINGFEED_TEST_NGINX_ROOT"], "set", OBJECTS, OBJECT_BYTES)
        log("seeded %d objects of %d bytes; nginx at %s" % (OBJECTS, OBJECT_BYTES, nginx))
        throttle_rows, hold_rows = [], []
        only = args.only.split(",")
        for build in builds:
            if "throttle" in only:
                for rate in (int(r) for r in args.rates.split(",")):
                    throttle_rows += throttle_cell(build, rate, nginx, state, crcs, args.runs)
            if "hold" in only:
                hold_rows += hold_cell(build, nginx, state, crcs, args.runs, args.hold_fraction, args.hold_ms,
                                       args.seed)
    finally:
        subprocess.run([SERVERS_SH, "stop", "nginx", state], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        shutil.rmtree(state, ignore_errors=True)
    report(args, throttle_rows, hold_rows, time.time() - t0)


def report(args, throttle_rows, hold_rows, total_s):
    lines = ["# Many loaders, one store (issue 40, items 1-2)\n",
             "Written by `bench/throttle_bench.py` on %s UTC, %s, %d CPUs, total %.0f s. nginx behind faultproxy "
             "`--rtt-ms %d`; %d objects of %d bytes; goal: goodput >= 85%% of the rate, <= 1.3 requests per "
             "object, exactly once; held: epoch <= 1.5x clean, <= 10%% extra requests.\n" % (
                 datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M"), platform.node(),
                 os.cpu_count(), total_s, RTT_MS, OBJECTS, OBJECT_BYTES)]
    if throttle_rows:
        lines.append("## Three loaders, one token bucket\n")
        lines.append("| build | rate | run | goodput (span) | goodput (run) | requests / object | refused | span | run | exactly once | load |")
        lines.append("|---|---|---|---|---|---|---|---|---|---|---|")
        for r in throttle_rows:
            lines.append("| %s | %d/s | %d | %.1f%% | %.1f%% | %.3f | %d | %.2f s | %.2f s | %s | %.1f |" % (
                r["build"], r["rate"], r["run"], r["goodput_span"], r["goodput_run"], r["per_object"], r["refused"],
                r["span"], r["secs"], r["ok"], r["load"]))
        lines.append("")
    if hold_rows:
        lines.append("## One loader, %.0f%% of responses held %d ms\n" % (args.hold_fraction * 100, args.hold_ms))
        lines.append("| build | run | clean epoch | held epoch | ratio | clean requests | held requests | extra | held | hedges (won) | exactly once | load |")
        lines.append("|---|---|---|---|---|---|---|---|---|---|---|---|")
        by = {}
        for r in hold_rows:
            by.setdefault((r["build"], r["run"]), {})[r["kind"]] = r
        for (build, run), k in by.items():
            c, h = k.get("clean"), k.get("held")
            if not (c and h and c["epoch"] and h["epoch"]):
                continue
            lines.append("| %s | %d | %.2f s | %.2f s | %.2fx | %d | %d | %+.1f%% | %d | %s (%s) | %s | %.1f |" % (
                build, run, c["epoch"], h["epoch"], h["epoch"] / c["epoch"], c["requests"], h["requests"],
                (h["requests"] / c["requests"] - 1) * 100, h["stalls"],
                "-" if h["hedges"] is None else "%d" % h["hedges"], "-" if h["won"] is None else "%d" % h["won"],
                "yes" if c["ok"] == h["ok"] == "yes" else (c["ok"] if c["ok"] != "yes" else h["ok"]), h["load"]))
        lines.append("")
    lines.append("Command: `%s`\n" % " ".join([sys.executable] + sys.argv))
    text = "\n".join(lines)
    print(text)
    if args.results:
        with open(args.results, "a") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
