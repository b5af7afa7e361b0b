#!/usr/bin/env python3
"""The consumer side of a small-sample batch: µs per batch, prints figures, never asserts.

    cargo build --release -p ringfeed -p ringfeed-ffi
    .venv/bin/python bench/batch_view_bench.py                       # this checkout's binding
    .venv/bin/python bench/batch_view_bench.py --package OLD/bindings/python   # another one (before/after)

A test loader (`ringfeed ring-test-producer`, the one tests/python uses) publishes
batches of B samples of L bytes (default 64 x 4 KiB) laid end to end; one Python
consumer takes them. For each way of reading a batch, the figure is the median of the
per-batch cost of that way alone (the views made from an already taken batch, timed
with perf_counter around them), and `loop` is the whole per-batch cost of the loop
(next(), the views, release). Rows the binding lacks (an older one: no samples() or
stack()) are left out. Numbers depend on the machine and on what else runs on it.
"""

import argparse
import os
import statistics
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def start_producer(binary, name, batches, batch_size, sample_bytes, slots):
    cmd = [binary, "ring-test-producer", "--name", name, "--world-size", "1", "--batches", str(batches),
           "--batch-size", str(batch_size), "--sample-bytes", str(sample_bytes), "--slots-per-rank", str(slots)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    if proc.stdout.readline().strip() != "ready":
        proc.kill()
        sys.exit("batch_view_bench: %s did not print 'ready'" % " ".join(cmd))
    return proc


WAYS = {
    # name: (what it does, the Batch attribute it needs, function of a batch)
    "sample(i) loop": ("[batch.sample(i) for i in range(B)]", "sample", lambda b: [b.sample(i) for i in range(len(b))]),
    "sample(i) loop, numpy": ("[np.frombuffer(batch.sample(i), np.uint8) ...] (the old Loader collate path)", "sample",
                              lambda b: [np.frombuffer(b.sample(i), dtype=np.uint8) for i in range(len(b))]),
    "samples()": ("batch.samples(): list of memoryviews", "samples", lambda b: b.samples()),
    "samples(numpy=True)": ("batch.samples(numpy=True): list of numpy uint8 views", "samples", lambda b: b.samples(numpy=True)),
    "array()": ("batch.array(): one (B, L) uint8 view", "array", lambda b: b.array()),
    "stack()": ("batch.stack(): one (B, L) uint8 view", "stack", lambda b: b.stack()),
    "offsets+lengths": ("batch.offsets, batch.lengths", "offsets", lambda b: (b.offsets, b.lengths)),
    "data": ("batch.data: numpy uint8 over the payload", "data", lambda b: b.data),
    "nothing": ("next() and release() alone", "release", lambda b: None),
}


def bench_ways(ringfeed, binary, args):
    """{way: median µs} over args.batches batches of one producer per way."""
    out = {}
    for way, (_, needs, fn) in WAYS.items():
        if not hasattr(ringfeed.Batch, needs):
            continue  # an older binding
        name = "bench-view-%d-%d" % (os.getpid(), len(out))
        proc = start_producer(binary, name, args.batches, args.batch_size, args.sample_bytes, args.slots)
        times, loops = [], []
        try:
            with ringfeed.attach(name, 0, timeout=10) as feed:
                feed.next(timeout=10).release()
                t_loop = time.perf_counter()
                for b in feed:
                    t0 = time.perf_counter()
                    made = fn(b)
                    times.append(time.perf_counter() - t0)
                    del made
                    b.release()
                    t1 = time.perf_counter()
                    loops.append(t1 - t_loop)
                    t_loop = t1
        finally:
            proc.wait(timeout=30)
        out[way] = (statistics.median(times) * 1e6, statistics.median(loops) * 1e6)
    return out


def bench_loader(ringfeed, binary, args):
    """{Loader variant: median µs per batch of the loop} (CPU tensors)."""
    import torch

    import ringfeed.torch

    variants = {
        "Loader(collate=torch.stack of samples)": dict(collate=lambda s: torch.stack([torch.from_numpy(x) for x in s])),
        "Loader(collate=list of samples)": dict(collate=lambda s: s),
        "Loader(shape=(L,))": dict(shape=(args.sample_bytes,)),
    }
    out = {}
    for label, kwargs in variants.items():
        name = "bench-loader-%d-%d" % (os.getpid(), len(out))
        proc = start_producer(binary, name, args.batches, args.batch_size, args.sample_bytes, args.slots)
        loops = []
        try:
            with ringfeed.attach(name, 0, timeout=10) as feed:
                loader = ringfeed.torch.Loader(feed, **kwargs)
                it = iter(loader)
                x = next(it)
                del x
                t = time.perf_counter()
                for x in it:
                    del x
                    t1 = time.perf_counter()
                    loops.append(t1 - t)
                    t = t1
        finally:
            proc.wait(timeout=30)
        out[label] = statistics.median(loops) * 1e6
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--package", default=os.path.join(REPO, "bindings", "python"), help="directory holding the ringfeed package to measure")
    ap.add_argument("--target", default=os.path.join(REPO, "target", "release"), help="cargo target dir with ringfeed and libringfeed.so")
    ap.add_argument("--batches", type=int, default=2000)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--sample-bytes", type=int, default=4096)
    ap.add_argument("--slots", type=int, default=4)
    ap.add_argument("--no-torch", action="store_true")
    args = ap.parse_args()
    os.environ.setdefault("RINGFEED_LIB", os.path.join(args.target, "libringfeed.so"))
    sys.path.insert(0, args.package)
    global np
    import numpy as np

    import ringfeed

    binary = os.environ.get("RINGFEED_BIN") or os.path.join(args.target, "ringfeed")
    print("batch_view_bench: %s, %d batches of %d x %d B, K=%d, python %s" % (
        os.path.dirname(ringfeed.__file__), args.batches, args.batch_size, args.sample_bytes, args.slots, sys.version.split()[0]))
    print("%-28s %12s %12s   %s" % ("way", "µs/batch", "loop µs", "what"))
    for way, (views, loop) in bench_ways(ringfeed, binary, args).items():
        print("%-28s %12.1f %12.1f   %s" % (way, views, loop, WAYS[way][0]))
    if not args.no_torch:
        for label, us in bench_loader(ringfeed, binary, args).items():
            print("%-40s loop %8.1f µs/batch" % (label, us))


if __name__ == "__main__":
    main()
