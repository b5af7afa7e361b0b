#!/usr/bin/env python3
"""The loader's memory and start with a million files: prints figures, never asserts.

    cargo build --release
    .venv/bin/pip install ./bindings/python
    .venv/bin/python bench/many_files.py            # ~2 min, 4 GB of disk (4 KiB blocks)
    .venv/bin/python bench/many_files.py --files 200000

Makes DATA_DIR/128B-N once (N files of 128 bytes, 1,000 per directory), then
serves it to W consumers (Python, releasing every batch unread) four times:
listed (`--manifest-cache refresh`), then three times with `use` (from the
cache, unless the listing was not stored: a tree changed less than 2 s
before it was listed is listed again, and the table says so). For
each: the loader's peak resident memory (ru_maxrss of the serve process), its
ring, and the seconds from launch to "planned" (listing or reading the cache,
checking it, planning; the consumers start at the same moment, so on 2 cores
this moves by a factor of 2-4 between runs). See docs/manifest.md "Memory".
"""

import argparse
import os
import re
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PER_DIR = 1000
CONSUMER = """
import ringfeed, sys
feed = ringfeed.attach(sys.argv[1], rank=int(sys.argv[2]))
for batch in feed:
    batch.release()
feed.close()
"""


def make_dataset(path, files, size):
    if os.path.exists(path + ".done"):
        return
    print("making %s: %d files of %d bytes..." % (path, files, size), file=sys.stderr, flush=True)
    payload = os.urandom(size)
    for d in range((files + PER_DIR - 1) // PER_DIR):
        sub = os.path.join(path, "d%05d" % d)
        os.makedirs(sub, exist_ok=True)
        for f in range(min(PER_DIR, files - d * PER_DIR)):
            with open(os.path.join(sub, "f%04d.bin" % f), "wb") as fh:
                fh.write(payload)
    open(path + ".done", "w").close()


def run(args, data, mode, n):
    name = "rfmany-%d-%d" % (os.getpid(), n)
    env = dict(os.environ, RINGFEED_CACHE_DIR=os.path.join(args.data_dir, "cache"))
    consumers = [
        subprocess.Popen([sys.executable, "-c", CONSUMER, name, str(r)], env=env)
        for r in range(args.world_size)
    ]
    cmd = [args.bin, "serve", "--source", data, "--name", name, "--batch-size", str(args.batch_size),
           "--world-size", str(args.world_size), "--manifest-cache", mode]
    serve = subprocess.Popen(cmd, env=env, stderr=subprocess.PIPE, text=True)
    _, status, usage = os.wait4(serve.pid, 0)
    log = serve.stderr.read()
    serve.returncode = os.waitstatus_to_exitcode(status)
    for c in consumers:
        c.wait()
    if serve.returncode != 0 or any(c.returncode for c in consumers):
        sys.exit("run failed (serve %d):\n%s" % (serve.returncode, log))
    planned = re.search(r"manifest: .*?, (from the cache|listed)[^\n]*planned in ([0-9.]+) s", log)
    ring = re.search(r"ring ([0-9.]+ [KMG]iB)", log)
    return {
        "mode": mode,
        "origin": planned.group(1) if planned else "?",
        "planned_s": float(planned.group(2)) if planned else float("nan"),
        "maxrss_mib": usage.ru_maxrss / 1024,
        "ring": ring.group(1) if ring else "?",
        "cmd": " ".join(cmd),
    }


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--files", type=int, default=1_000_000)
    p.add_argument("--size", type=int, default=128)
    p.add_argument("--data-dir", default="/tmp/ringfeed-bench")
    p.add_argument("--bin", default=os.path.join(REPO, "target", "release", "ringfeed"))
    p.add_argument("--world-size", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=256)
    args = p.parse_args()
    data = os.path.join(args.data_dir, "%dB-%d" % (args.size, args.files))
    make_dataset(data, args.files, args.size)
    rows = [run(args, data, mode, i) for i, mode in enumerate(["refresh", "use", "use", "use"])]
    print("%d files of %d B, W=%d, B=%d (%s)" % (args.files, args.size, args.world_size, args.batch_size, data))
    print("| --manifest-cache | manifest | launch to planned, s | serve peak RSS, MiB | ring |")
    print("|---|---|---|---|---|")
    for r in rows:
        print("| %s | %s | %.2f | %.1f | %s |" % (r["mode"], r["origin"], r["planned_s"], r["maxrss_mib"], r["ring"]))
    print("\ncommand: %s" % rows[-1]["cmd"])


if __name__ == "__main__":
    main()
