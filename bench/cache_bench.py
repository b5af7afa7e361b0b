#!/usr/bin/env python3
"""Data cache benchmark (issue 22, points 1 and 2): prints figures, never asserts.

    cargo build --release -p ringfeed --bin ringfeed && cargo build --release -p faultproxy -p ringfeed-ffi
    /work/venv/bin/python bench/cache_bench.py            # ~2 min; root (drops the page cache)

The 20 ms path of bench/remote_bench.py: nginx (WebDAV) behind tests/faultproxy
adding 20 ms per round trip, 2,000 objects of 100 KB. Rows, each a separate
`ringfeed serve --epochs 1` (same seed) read by one Python consumer that touches
no bytes, timed from its first batch to its last:
  remote, cache off      every byte from the 20 ms path
  epoch 1 (fill)         a fresh cache: from remote, written to the cache as it goes
  epoch 2, 3             the cache holds the dataset: from local disk
  local directory        the same files served from nginx's root directory
The page cache is dropped (echo 3 > /proc/sys/vm/drop_caches) before every
row marked "cold"; "warm" rows run right after a cold one over the same files.
Then point 2: a cache of half the dataset, filled, then two epochs: hits,
misses and remote bytes as the loader reports them, and LRU on the same
orders computed by bench/cache_sim.py's LRU.
Figures go to stdout and to bench/RESULTS-cache.md (--results).
"""

import argparse
import datetime
import os
import platform
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "bench"))
import remote_bench as rb  # noqa: E402  (servers, proxy)
import cache_sim  # noqa: E402

SIZE, COUNT = 100_000, 2000
BATCH = 64


def log(msg):
    print("[cache_bench %s] %s" % (time.strftime("%H:%M:%S"), msg), file=sys.stderr, flush=True)


def drop_caches():
    subprocess.run(["sync"], check=False)
    try:
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
        return True
    except OSError as e:
        log("cannot drop the page cache (%s): the cold rows are warm" % e)
        return False


def serve_once(bin_path, source, cache_dir, extra=(), seed=0):
    """One `serve --epochs 1`; returns (MB/s, objects/s, seconds, loader log)."""
    name = "cbench%d" % os.getpid()
    cmd = [bin_path, "serve", "--source", source, "--name", name, "--batch-size", str(BATCH), "--world-size", "1",
           "--epochs", "1", "--seed", str(seed), "--cache-dir", cache_dir, *extra]
    rb.note_cmd([c if c != name else "NAME" for c in cmd])
    serve = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True)
    lines = []
    reader = threading.Thread(target=lambda: lines.extend(l.rstrip("\n") for l in serve.stderr), daemon=True)
    reader.start()
    import ringfeed

    try:
        feed = ringfeed.attach(name, 0, timeout=120)
        t_first = t_last = None
        nbytes = nobj = 0
        for b in feed:
            now = time.time()
            if t_first is None:
                t_first = now
            else:
                nbytes += b.nbytes
                nobj += len(b)
            t_last = now
            b.release()
        feed.close()
        serve.wait(timeout=60)
    finally:
        if serve.poll() is None:
            serve.send_signal(signal.SIGTERM)
            serve.wait(timeout=15)
        reader.join(timeout=5)
    secs = t_last - t_first
    return nbytes / secs / 1e6, nobj / secs, secs, "\n".join(lines)


def serve_epochs(bin_path, source, cache_dir, epochs, extra=()):
    """One `serve --epochs N`; returns ([MB/s of each epoch], loader log). An
    epoch is timed from its first batch to the first batch of the next (the
    first from its first batch to its last)."""
    name = "cbenche%d" % os.getpid()
    cmd = [bin_path, "serve", "--source", source, "--name", name, "--batch-size", str(BATCH), "--world-size", "1",
           "--epochs", str(epochs), "--seed", "0", "--cache-dir", cache_dir, *extra]
    rb.note_cmd([c if c != name else "NAME" for c in cmd])
    serve = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True)
    lines = []
    reader = threading.Thread(target=lambda: lines.extend(l.rstrip("\n") for l in serve.stderr), daemon=True)
    reader.start()
    import ringfeed

    per = {}  # epoch -> [t_first, t_last, bytes after the first batch]
    cpu = []  # (epoch, {thread name: CPU seconds}) at each epoch's first batch, then at the end
    try:
        feed = ringfeed.attach(name, 0, timeout=120)
        for b in feed:
            now = time.time()
            if b.epoch not in per:
                cpu.append((b.epoch, threads_cpu(serve.pid)))
            e = per.setdefault(b.epoch, [now, now, 0])
            if e[0] != now:
                e[2] += b.nbytes
            e[1] = now
            b.release()
        cpu.append((None, threads_cpu(serve.pid)))
        feed.close()
        serve.wait(timeout=60)
    finally:
        if serve.poll() is None:
            serve.send_signal(signal.SIGTERM)
            serve.wait(timeout=15)
        reader.join(timeout=5)
    rates = []
    keys = sorted(per)
    for i, k in enumerate(keys):
        t0, t1, n = per[k]
        rates.append(n / max(t1 - t0, 1e-9) / 1e6)
    # Per epoch, each thread's CPU seconds (the loader's main thread is "ringfeed").
    per_cpu = []
    for (epoch, a), (_, b) in zip(cpu, cpu[1:]):
        per_cpu.append((epoch, {t: b.get(t, 0.0) - a.get(t, 0.0) for t in b if b.get(t, 0.0) - a.get(t, 0.0) > 0.005}))
    log("  CPU seconds per epoch by thread: %s" % "; ".join(
        "e%d %s" % (e, ", ".join("%s %.3f" % kv for kv in sorted(d.items()))) for e, d in per_cpu))
    return rates, "\n".join(lines)


def threads_cpu(pid):
    """{thread name: utime + stime seconds} of a live process, threads of one name summed."""
    out = {}
    tick = os.sysconf("SC_CLK_TCK")
    try:
        tids = os.listdir("/proc/%d/task" % pid)
    except OSError:
        return out
    for tid in tids:
        try:
            with open("/proc/%d/task/%s/stat" % (pid, tid)) as f:
                raw = f.read()
        except OSError:
            continue
        comm = raw[raw.index("(") + 1:raw.rindex(")")]
        fields = raw.rsplit(")", 1)[1].split()
        out[comm] = out.get(comm, 0.0) + (int(fields[11]) + int(fields[12])) / tick
    return out


def epochs_section(bin_path, url, local, cache_dir, epochs=3):
    """Issue 29 point 2: per epoch of a filling run, of a later run from the
    full cache, and of the local directory, all in one `serve --epochs N`
    each, page cache warm."""
    shutil.rmtree(cache_dir, ignore_errors=True)
    out = []
    for label, source in (("filling run", url), ("later run (full cache)", url), ("local directory", local)):
        rates, text = serve_epochs(bin_path, source, cache_dir, epochs)
        log("%-24s %s MB/s  cache %s" % (label, " ".join("%.0f" % r for r in rates), cache_line(text)))
        out.append((label, rates, cache_line(text)))
    return out


def cache_line(text):
    m = re.search(r"data cache: (\d+) hits, (\d+) misses, (\d+) bytes from cache, (\d+) bytes from remote", text)
    return tuple(int(x) for x in m.groups()) if m else None


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", default=os.path.join(REPO, "target", "release"))
    ap.add_argument("--results", default=os.path.join(REPO, "bench", "RESULTS-cache.md"))
    ap.add_argument("--epochs-only", action="store_true",
                    help="only the per-epoch rows (filling run, later run, local directory); no results file")
    ap.add_argument("--count", type=int, default=COUNT, help="objects (default %(default)s)")
    args = ap.parse_args()
    bin_path = os.path.join(args.target, "ringfeed")
    os.environ.setdefault("RINGFEED_LIB", os.path.join(args.target, "libringfeed.so"))
    sys.path.insert(0, os.path.join(REPO, "bindings", "python"))
    state = tempfile.mkdtemp(prefix="rfcache-")
    procs, rows, half_rows, epoch_rows = [], [], [], []
    t0 = time.time()
    try:
        ngx_pid, ngx_env = rb.start_server("nginx", state)
        ngx_port = int(ngx_env["RINGFEED_TEST_NGINX_URL"].rstrip("/").rsplit(":", 1)[1])
        proxy, proxy_port = rb.start_proxy(args.target, "127.0.0.1:%d" % ngx_port, state, "nginx")
        procs.append(proxy)
        root = ngx_env["RINGFEED_TEST_NGINX_ROOT"]
        local = os.path.join(root, "ds100k")
        os.makedirs(local, exist_ok=True)
        for i in range(args.count):
            with open(os.path.join(local, "%06d.bin" % i), "wb") as f:
                f.write(os.urandom(SIZE))
        url = "http://127.0.0.1:%d/ds100k/" % proxy_port
        cache_dir = os.path.join(state, "cache")
        log("nginx on %d behind faultproxy %d (%d ms RTT); %d x %d bytes" % (ngx_port, proxy_port, rb.RTT_MS, args.count, SIZE))
        epoch_rows = epochs_section(bin_path, url, local, cache_dir)
        if args.epochs_only:
            for label, rates, c in epoch_rows:
                print("| %s | %s | %s |" % (label, " | ".join("%.0f" % r for r in rates), c))
            return
        shutil.rmtree(cache_dir, ignore_errors=True)

        def row(label, source, extra=(), cold=True):
            if cold:
                drop_caches()
            mbs, ops, secs, text = serve_once(bin_path, source, cache_dir, extra)
            c = cache_line(text)
            rows.append((label, "cold" if cold else "warm", mbs, ops, secs, c))
            for line in text.splitlines():
                if "data cache" in line:
                    log("  " + line.strip())
            log("%-22s %s %8.1f MB/s %7.0f obj/s %6.2f s  cache %s" % (label, "cold" if cold else "warm", mbs, ops, secs, c))

        row("remote, cache off", url, ["--cache", "off"])
        row("epoch 1 (fill)", url)
        row("epoch 2 (cached)", url)
        row("epoch 3 (cached)", url, cold=False)
        row("epoch 3 (cached)", url)
        row("local directory", local)
        row("local directory", local, cold=False)

        # Point 2: half the dataset.
        shutil.rmtree(cache_dir, ignore_errors=True)
        half = COUNT // 2 * (SIZE + 64)
        for label, seed in (("fill (half)", 0), ("epoch 2 (half)", 1), ("epoch 3 (half)", 2)):
            mbs, ops, secs, text = serve_once(bin_path, url, cache_dir, ["--cache-size", str(half)], seed=seed)
            half_rows.append((label, mbs, cache_line(text)))
            log("%-22s %8.1f MB/s  cache %s" % (label, mbs, cache_line(text)))
            for line in text.splitlines():
                if "data cache" in line:
                    log("  " + line.strip())
    finally:
        for p in procs:
            p.terminate()
        subprocess.run([rb.SERVERS_SH, "stop", "nginx", state], capture_output=True)
        shutil.rmtree(state, ignore_errors=True)

    orders = []
    import random

    rng = random.Random(0)
    for _ in range(6):
        o = list(range(COUNT))
        rng.shuffle(o)
        orders.append(o)
    lru = cache_sim.lru(orders, COUNT // 2)
    lru_rate = 100.0 * sum(lru[1:]) / (5 * COUNT)

    out = ["# Data cache benchmark (issue 22)", "",
           "%s, %s, %d cores; `python3 bench/cache_bench.py` (%.0f s). nginx WebDAV behind faultproxy `--rtt-ms %d`; "
           "%d objects of %d bytes; batch %d, one Python consumer touching no bytes; each row one `serve --epochs 1`, "
           "timed from its first batch to its last. cold: page cache dropped before the row."
           % (datetime.date.today(), platform.node(), os.cpu_count(), time.time() - t0, rb.RTT_MS, COUNT, SIZE, BATCH),
           "", "## Point 1: a cache that holds the dataset", "",
           "| row | page cache | MB/s | objects/s | seconds | hits, misses, bytes from cache, bytes from remote |",
           "|---|---|---|---|---|---|"]
    for label, cold, mbs, ops, secs, c in rows:
        out.append("| %s | %s | %.1f | %.0f | %.2f | %s |" % (label, cold, mbs, ops, secs, c if c else "-"))
    by = {(r[0], r[1]): r[2] for r in rows}
    e1, e2 = by.get(("epoch 1 (fill)", "cold")), by.get(("epoch 2 (cached)", "cold"))
    loc = by.get(("local directory", "cold"))
    if e1 and e2 and loc:
        out += ["", "- epoch 2 / epoch 1: %.1fx (goal 5x); epoch 2 / local directory, both cold: %.0f%% (goal 60%%)"
                % (e2 / e1, 100 * e2 / loc)]
    out += ["", "## Per epoch within one run (issue 29 point 2; `serve --epochs 3`, page cache warm)", "",
            "| run | MB/s per epoch | hits, misses, bytes from cache, bytes from remote |", "|---|---|---|"]
    for label, rates, c in epoch_rows:
        out.append("| %s | %s | %s |" % (label, ", ".join("%.0f" % r for r in rates), c))
    out += ["", "## Point 2: a cache of half the dataset", "",
            "| run | MB/s | hits | misses | hit rate | bytes from remote | misses x %d |" % SIZE, "|---|---|---|---|---|---|---|"]
    for label, mbs, c in half_rows:
        if c:
            h, m, _, rbytes = c
            out.append("| %s | %.1f | %d | %d | %.1f%% | %d | %d |" % (label, mbs, h, m, 100.0 * h / max(1, h + m), rbytes, m * SIZE))
    out += ["", "LRU on the same kind of order (a fresh permutation each epoch, C/N = 0.5, computed with "
            "bench/cache_sim.py's LRU over %d objects): %.1f%% per epoch after the first." % (COUNT, lru_rate),
            "", "## Commands", ""] + ["    " + c for c in rb.COMMANDS]
    text = "\n".join(out) + "\n"
    print(text)
    with open(args.results, "w") as f:
        f.write(text)


if __name__ == "__main__":
    main()
