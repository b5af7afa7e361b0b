#!/usr/bin/env python3
"""ringfeed loader benchmark: prints figures, never asserts.

    cargo build --release
    .venv/bin/pip install ./bindings/python psutil      # psutil is optional
    .venv/bin/python bench/loader_bench.py               # everything, ~6 min
    .venv/bin/python bench/loader_bench.py --only warm,ttfb --files 20000

Parts (--only, comma-separated; default all, run in this order):
  memcpy      numpy copy of a 1 GiB buffer, one thread, best of 3
  cold        drop the page cache, ringfeed (--io uring, --io pread) vs fio
  warm        page cache warm: ringfeed W=1,2, queue-depth x slots sweep,
              consumers that touch nothing / sum every byte / copy every byte;
              fio over the warm page cache as the kernel's ceiling
  dataloader  torch DataLoader (num_workers=2, shuffle, default collate)
  ttfb        time to first batch with 1, 2, 8 consumers waiting in attach
  dlttfb      the same for W DataLoader ranks (num_workers=2 each), B=64, 100 KB

Datasets are made once under --data-dir and reused. The table is printed and
written to bench/RESULTS.md (--results). See bench/README.md.
"""

import argparse
import concurrent.futures
import datetime
import json
import os
import platform
import re
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import threading
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PARTS = ["memcpy", "cold", "warm", "dataloader", "ttfb", "dlttfb"]
SIZE_BIG = 100_000  # "100 KB" files
SIZE_SMALL = 4096  # 4 KiB files
SHARD = 1000  # files per subdirectory
GB = 1e9
MiB = 1 << 20

COMMANDS = []  # exact command lines run, for RESULTS.md


def log(msg):
    print("[bench %s] %s" % (time.strftime("%H:%M:%S"), msg), file=sys.stderr, flush=True)


def gbs(nbytes, secs):
    return nbytes / secs / GB if secs and secs > 0 else float("nan")


def note_cmd(cmd, env=None):
    text = " ".join(shlex.quote(str(c)) for c in cmd)
    if env:
        text = " ".join("%s=%s" % (k, shlex.quote(v)) for k, v in env.items()) + " " + text
    if text not in COMMANDS:
        COMMANDS.append(text)
    return text


# ---------------------------------------------------------------------------
# /proc helpers


def proc_status(pid):
    """VmRSS, VmHWM, RssAnon, RssFile, RssShmem in bytes (missing: 0); None if gone."""
    out = {}
    try:
        with open("/proc/%s/status" % pid) as f:
            for line in f:
                key, _, rest = line.partition(":")
                if key in ("VmRSS", "VmHWM", "RssAnon", "RssFile", "RssShmem"):
                    out[key] = int(rest.split()[0]) * 1024
    except (OSError, ValueError):
        return None
    return out


def proc_cpu_secs(pid):
    """utime + stime of a process (all its threads), in seconds; None if gone."""
    try:
        with open("/proc/%s/stat" % pid) as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


def children_of(pid):
    """Every descendant pid (psutil if installed, else /proc/*/task/*/children)."""
    try:
        import psutil

        return [c.pid for c in psutil.Process(pid).children(recursive=True)]
    except ImportError:
        pass
    except Exception:
        return []
    found, todo = [], [pid]
    while todo:
        p = todo.pop()
        try:
            for tid in os.listdir("/proc/%d/task" % p):
                with open("/proc/%d/task/%s/children" % (p, tid)) as f:
                    kids = [int(x) for x in f.read().split()]
                found += kids
                todo += kids
        except OSError:
            pass
    return found


class RssSampler(threading.Thread):
    """Samples /proc/PID/status (optionally with descendants) and keeps peaks."""

    def __init__(self, pid, with_children=False, interval=0.02):
        super().__init__(daemon=True)
        self.pid, self.with_children, self.interval = pid, with_children, interval
        self.peak = {}  # key -> peak of the sum over processes
        self.last_own = {}  # last status of pid itself
        self.max_procs = 0
        self.cpu_secs = 0.0
        self.stop_ev = threading.Event()

    def run(self):
        while not self.stop_ev.is_set():
            own = proc_status(self.pid)
            if own is None or "VmRSS" not in own:  # gone, or a zombie (no mm)
                break
            self.last_own = own
            cpu = proc_cpu_secs(self.pid)
            if cpu is not None:
                self.cpu_secs = cpu
            total = dict(own)
            n = 1
            if self.with_children:
                for c in children_of(self.pid):
                    st = proc_status(c)
                    if st:
                        n += 1
                        for k, v in st.items():
                            total[k] = total.get(k, 0) + v
            self.max_procs = max(self.max_procs, n)
            for k, v in total.items():
                self.peak[k] = max(self.peak.get(k, 0), v)
            self.stop_ev.wait(self.interval)

    def stop(self):
        self.stop_ev.set()
        self.join(timeout=5)


WARMED = set()  # datasets read since the last drop_caches


def drop_caches():
    WARMED.clear()
    subprocess.run(["sync"], check=False)
    try:
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
        return True
    except OSError as e:
        log("cannot drop caches (%s): cold figures would be warm; need root" % e)
        return False


# ---------------------------------------------------------------------------
# datasets


def dataset_dir(data_dir, size, n):
    label = "100KB" if size == SIZE_BIG else ("4KiB" if size == SIZE_SMALL else "%dB" % size)
    return os.path.join(data_dir, "%s-%d" % (label, n))


def file_path(root, i):
    return os.path.join(root, "d%05d" % (i // SHARD), "f%07d.bin" % i)


def ensure_dataset(data_dir, size, n, threads=4):
    """Makes n files of size bytes under data_dir (once); returns the directory.

    Content: a 64 MiB random block, each file a slice of it at an index-derived
    offset with the file index in its first 8 bytes (distinct files, no
    compression or dedup can help). The '.done' marker lies beside the
    directory, not in it, so the manifest sees only the samples.
    """
    root = dataset_dir(data_dir, size, n)
    marker = root + ".done"
    if os.path.exists(marker):
        log("dataset %s present (%d files of %d bytes)" % (root, n, size))
        return root
    if os.path.exists(root):
        shutil.rmtree(root)
    os.makedirs(root)
    for s in range((n + SHARD - 1) // SHARD):
        os.makedirs(os.path.join(root, "d%05d" % s), exist_ok=True)
    block = os.urandom(64 * MiB)
    span = len(block) - size

    def write_range(lo, hi):
        for i in range(lo, hi):
            off = (i * 4099 * 64) % span
            data = i.to_bytes(8, "little") + block[off + 8 : off + size] if size >= 8 else block[off : off + size]
            fd = os.open(file_path(root, i), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            try:
                os.write(fd, data)
            finally:
                os.close(fd)

    t = time.perf_counter()
    over_ranges(n, threads, write_range)
    subprocess.run(["sync"], check=False)
    secs = time.perf_counter() - t
    log("wrote %s: %d files of %d bytes in %.1f s (%.2f GB/s incl. sync)" % (root, n, size, secs, gbs(n * size, secs)))
    with open(marker, "w") as f:
        json.dump({"files": n, "size": size}, f)
    return root


def over_ranges(n, threads, fn, step=2000):
    """Calls fn(lo, hi) over 0..n in runs of `step`, on `threads` threads."""
    with concurrent.futures.ThreadPoolExecutor(threads) as ex:
        list(ex.map(lambda lo: fn(lo, min(lo + step, n)), range(0, n, step)))


def warm_cache(root, n, size, threads=4):
    """Reads every file once (untimed for the figures; the time is logged)."""
    if root in WARMED:
        return
    WARMED.add(root)
    buf_size = max(size, 4096)

    def read_range(lo, hi):
        buf = bytearray(buf_size)
        mv = memoryview(buf)
        for i in range(lo, hi):
            fd = os.open(file_path(root, i), os.O_RDONLY)
            try:
                while os.readv(fd, [mv]) > 0:
                    pass
            finally:
                os.close(fd)

    t = time.perf_counter()
    over_ranges(n, threads, read_range)
    secs = time.perf_counter() - t
    log("warmed %s: %.1f s (%.2f GB/s, Python threads)" % (root, secs, gbs(n * size, secs)))


# ---------------------------------------------------------------------------
# memcpy


def bench_memcpy():
    import ctypes

    import numpy as np

    n = 1 << 30
    src = np.ones(n, dtype=np.uint8)
    dst = np.ones(n, dtype=np.uint8)  # both faulted in before timing
    best = best_mm = float("inf")
    for _ in range(3):
        t = time.perf_counter()
        np.copyto(dst, src)
        best = min(best, time.perf_counter() - t)
    for _ in range(3):
        t = time.perf_counter()
        ctypes.memmove(dst.ctypes.data, src.ctypes.data, n)
        best_mm = min(best_mm, time.perf_counter() - t)
    # GB/s = bytes copied / s (the memory traffic is twice that: read + write)
    return {"memcpy_GBps": gbs(n, best), "memmove_GBps": gbs(n, best_mm), "secs": best, "first_touch_GBps": bench_first_touch()}


def bench_first_touch(n=256 << 20):
    """Bytes per second at which fresh shared memory becomes usable: a new
    /dev/shm file of n bytes mapped with MAP_POPULATE (allocate, zero and map
    every page), median of 3. Every byte of a ring is first touched this way
    once, so it bounds the first pass over the ring (the first batches)."""
    import mmap

    times = []
    for i in range(3):
        path = "/dev/shm/ringfeed-bench-first-touch-%d" % os.getpid()
        fd = os.open(path, os.O_CREAT | os.O_RDWR | os.O_TRUNC, 0o600)
        try:
            os.ftruncate(fd, n)
            t = time.perf_counter()
            m = mmap.mmap(fd, n, flags=mmap.MAP_SHARED | mmap.MAP_POPULATE)
            times.append(time.perf_counter() - t)
            m.close()
        finally:
            os.close(fd)
            os.unlink(path)
    return gbs(n, statistics.median(times))


# ---------------------------------------------------------------------------
# ringfeed runs

_run_counter = [0]


def lib_env(args):
    env = dict(os.environ)
    if args.lib:
        env["RINGFEED_LIB"] = args.lib
    # serve keeps its manifest cache beside the datasets (unless the caller
    # chose a cache): the first run over a dataset lists it, later ones start
    # from the cache, as a user's second start would.
    env.setdefault("RINGFEED_CACHE_DIR", os.path.join(args.data_dir, "cache"))
    return env


def run_ringfeed(args, root, batch, world, io="auto", slots=None, qd=None, touch="none", epochs=1, max_batches=0, kill_after=False, label="", shuffle=True):
    """One serve + `world` consumer processes. Consumers are started first and
    wait in attach; then serve starts. Returns a dict of figures."""
    _run_counter[0] += 1
    name = "rfbench-%d-%d" % (os.getpid(), _run_counter[0])
    env = lib_env(args)
    consumers = []
    for r in range(world):
        cmd = [sys.executable, os.path.abspath(__file__), "_consumer", "--name", name, "--rank", str(r), "--touch", touch, "--max-batches", str(max_batches)]
        consumers.append(subprocess.Popen(cmd, stdout=subprocess.PIPE, env=env, text=True))
    note_cmd([sys.executable, "bench/loader_bench.py", "_consumer", "--name", "NAME", "--rank", "R", "--touch", touch], {"RINGFEED_LIB": args.lib} if args.lib else None)
    for c in consumers:  # every consumer imported numpy/ringfeed and is about to attach
        line = c.stdout.readline()
        if not line.startswith("READY"):
            raise RuntimeError("consumer did not start: %r" % line)
    serve_cmd = [args.bin, "serve", "--source", root, "--name", name, "--batch-size", str(batch), "--world-size", str(world), "--epochs", str(epochs), "--io", io]
    if slots:
        serve_cmd += ["--slots-per-rank", str(slots)]
    if not shuffle:
        serve_cmd += ["--no-shuffle"]
    if qd:
        serve_cmd += ["--queue-depth", str(qd)]
    note_cmd([c if c != name else "NAME" for c in serve_cmd])
    t_start = time.time()
    serve = subprocess.Popen(serve_cmd, stderr=subprocess.PIPE, text=True, env=env)
    stderr_lines, marks = [], {}

    def read_stderr():
        for line in serve.stderr:
            now = time.time()
            stderr_lines.append(line.rstrip("\n"))
            if "ringfeed: manifest:" in line and "t_listed" not in marks:
                marks["t_listed"] = now
            if "ringfeed: serving" in line and "t0" not in marks:
                marks["t0"] = now
                marks["cpu0"] = proc_cpu_secs(serve.pid) or 0.0
            if "ringfeed: done" in line:
                marks["done"] = now

    reader = threading.Thread(target=read_stderr, daemon=True)
    reader.start()
    sampler = RssSampler(serve.pid, interval=0.02)
    sampler.start()
    seg = "/dev/shm/ringfeed-" + name
    ring_bytes = 0
    results = []
    try:
        for c in consumers:
            # Poll so the segment size can be read while it exists.
            while c.poll() is None:
                if not ring_bytes and os.path.exists(seg):
                    try:
                        ring_bytes = os.stat(seg).st_size
                    except OSError:
                        pass
                time.sleep(0.01)
            out = c.stdout.read()
            res = json.loads(out.strip().splitlines()[-1]) if out.strip() else {"error": "no output, rc %s" % c.returncode}
            results.append(res)
        if kill_after:
            serve.send_signal(signal.SIGTERM)
        rc = serve.wait(timeout=120)
    finally:
        for p in consumers + [serve]:
            if p.poll() is None:
                p.kill()
                p.wait()
    reader.join(timeout=5)
    sampler.stop()
    errs = [r["error"] for r in results if "error" in r]
    if errs or (rc != 0 and not kill_after):
        log("ringfeed run %s failed: rc %s, consumer errors %s; serve stderr:\n  %s" % (label, rc, errs, "\n  ".join(stderr_lines[-10:])))
    ok = [r for r in results if "error" not in r]
    total = sum(r["bytes"] for r in ok)
    firsts = [r["t_first"] for r in ok if r["t_first"]]
    lasts = [r["t_last"] for r in ok]
    t_first, t_last = (min(firsts), max(lasts)) if firsts else (None, None)
    own = sampler.last_own
    serving = next((l for l in stderr_lines if "ringfeed: serving" in l), "")
    k_used = re.search(r"(\d+) slots/rank", serving)
    out = {
        "label": label,
        "world": world,
        "batch": batch,
        "io": io,
        "shuffle": shuffle,
        "slots": int(k_used.group(1)) if k_used else slots,
        "qd": qd or DEFAULT_QD,
        "default": slots is None and qd is None,
        "touch": touch,
        "rc": rc,
        "ok": not errs and (rc == 0 or kill_after),
        "bytes": total,
        "batches": sum(r["batches"] for r in ok),
        "samples": sum(r["samples"] for r in ok),
        "gbps_first_last": gbs(total, t_last - t_first) if t_first else float("nan"),
        "gbps_from_start": gbs(total, t_last - t_start) if t_last else float("nan"),
        "gbps_from_t0": gbs(total, t_last - marks["t0"]) if t_last and "t0" in marks else float("nan"),
        "t_manifest": marks.get("t_listed", float("nan")) - t_start,
        "manifest_cached": any("ringfeed: manifest:" in l and "from the cache" in l for l in stderr_lines),
        "ttfb": [r["t_first"] - marks["t_listed"] for r in ok if r["t_first"] and "t_listed" in marks],
        "t_ring": marks.get("t0", float("nan")) - marks.get("t_listed", float("nan")),
        "ttfb_from_start": [r["t_first"] - t_start for r in ok if r["t_first"]],
        "attached": [r["t_attached"] - marks["t_listed"] for r in ok if "t_listed" in marks],
        "wait_frac": max((r["wait_s"] / max(r["t_last"] - r["t_first"], 1e-9) for r in ok if r["t_first"]), default=float("nan")),
        "ring_bytes": ring_bytes,
        "serve_cpu_cores": (sampler.cpu_secs - marks["cpu0"]) / (t_last - marks["t0"]) if t_last and "t0" in marks else float("nan"),
        "cons_cpu_cores": max((r["cpu_s"] / max(r["t_last"] - r["t_first"], 1e-9) for r in ok if r["t_first"]), default=float("nan")),
        "serve_hwm": own.get("VmHWM", 0),
        "serve_anon_peak": sampler.peak.get("RssAnon", 0),
        "serve_shmem_peak": sampler.peak.get("RssShmem", 0),
        "cons_hwm": max((r["status"].get("VmHWM", 0) for r in ok), default=0),
        "cons_anon": max((r["status"].get("RssAnon", 0) for r in ok), default=0),
        "cons_shmem": max((r["status"].get("RssShmem", 0) for r in ok), default=0),
        "serve_done": next((l for l in stderr_lines if "ringfeed: done" in l), ""),
        # serve's own view: first and last rank's first batch published, ms after the ring was created
        "loader_first_batches": loader_first_batches(stderr_lines),
        "serve_warnings": [l for l in stderr_lines if "WARN" in l or "warn" in l.lower()][:3],
    }
    log(
        "%-28s W=%d B=%d io=%s K=%s qd=%s touch=%s: %.2f GB/s first->last, %.2f GB/s from start, manifest %.2f s, rc %s %s"
        % (label, world, batch, io, slots, qd, touch, out["gbps_first_last"], out["gbps_from_start"], out["t_manifest"], rc, out["serve_done"].replace("ringfeed: ", ""))
    )
    return out


def go_together(procs):
    """Waits for each process's READY line, then writes `go` to all of them
    back to back; returns the time of the first write, or None if one did
    not get ready."""
    for p in procs:
        if p.stdout.readline().strip() != "READY":
            return None
    t_go = time.time()
    for p in procs:
        p.stdin.write("go\n")
        p.stdin.flush()
    return t_go


def run_serve_first(args, root, batch, world):
    """The other order: serve starts first (as `ringfeed serve ... &` before
    torchrun); once it logs that every rank's first batch is published, W
    consumers start, import numpy and ringfeed, and wait; then all are told
    to go at once, attach, and take their first batch. Returns seconds after
    go per rank (sorted), or None."""
    _run_counter[0] += 1
    name = "rfbench-%d-%d" % (os.getpid(), _run_counter[0])
    env = lib_env(args)
    serve_cmd = [args.bin, "serve", "--source", root, "--name", name, "--batch-size", str(batch), "--world-size", str(world), "--epochs", "1"]
    note_cmd([c if c != name else "NAME" for c in serve_cmd] + ["# then the consumers, with --wait-go"])
    serve = subprocess.Popen(serve_cmd, stderr=subprocess.PIPE, text=True, env=env)
    consumers = []
    try:
        published = False
        for line in serve.stderr:
            if "first batch of every rank published" in line:
                published = True
                break
        if not published:
            log("serve-first run: serve ended before publishing (rc %s)" % serve.wait())
            return None
        threading.Thread(target=lambda: [None for _ in serve.stderr], daemon=True).start()
        for r in range(world):
            cmd = [sys.executable, os.path.abspath(__file__), "_consumer", "--name", name, "--rank", str(r), "--max-batches", "1", "--wait-go"]
            consumers.append(subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env, text=True))
        t_go = go_together(consumers)
        if t_go is None:
            log("serve-first run: a consumer did not start")
            return None
        results = []
        for c in consumers:
            out, _ = c.communicate(timeout=60)
            results.append(json.loads(out.strip().splitlines()[-1]))
        if any("error" in r for r in results):
            log("serve-first run failed: %s" % [r.get("error") for r in results])
            return None
        return {
            "after_go": sorted(r["t_first"] - t_go for r in results),
            "call_to_first": sorted(r["t_first"] - r["t_call"] for r in results),
        }
    finally:
        for p in consumers:
            if p.poll() is None:
                p.kill()
                p.wait()
        if serve.poll() is None:
            serve.send_signal(signal.SIGTERM)
            try:
                serve.wait(timeout=30)
            except subprocess.TimeoutExpired:
                serve.kill()
                serve.wait()


def loader_first_batches(lines):
    """(first, all) from serve's `first batch of every rank published` line, in seconds."""
    for l in lines:
        m = re.search(r"first batch of every rank published: the first ([\d.]+) ms after the ring was created, all \d+ after ([\d.]+) ms", l)
        if m:
            return float(m.group(1)) / 1000, float(m.group(2)) / 1000
    return None


def consumer_main(a):
    """A trainer stand-in: attach, take every batch, optionally read it, release."""
    import numpy as np

    if a.touch != "none":
        sys.setswitchinterval(0.005)
    import ringfeed

    print("READY", flush=True)
    if a.wait_go:
        sys.stdin.readline()
    t_call = time.time()
    cpu0 = sum(os.times()[:2])
    try:
        feed = ringfeed.attach(name=a.name, rank=a.rank, timeout=300)
    except Exception as e:  # noqa: BLE001 - reported to the parent
        print(json.dumps({"error": "attach: %s" % e}), flush=True)
        return
    t_attached = time.time()
    t_first = None
    batches = samples = nbytes = 0
    wait = 0.0
    check = 0
    scratch = None

    def touch_sum(b):
        n = b.nbytes
        buf = b.buffer()
        s = int(np.frombuffer(buf, dtype=np.uint64, count=n // 8).sum(dtype=np.uint64))
        tail = n % 8
        if tail:
            s += int(np.frombuffer(buf, dtype=np.uint8, count=tail, offset=n - tail).sum())
        return s

    def touch_copy(b, scratch):
        n = b.nbytes
        if scratch is None or len(scratch) < n:
            scratch = np.empty(max(n, 1), dtype=np.uint8)
        np.copyto(scratch[:n], np.frombuffer(b.buffer(), dtype=np.uint8, count=n))
        return scratch

    try:
        while True:
            t = time.perf_counter()
            batch = feed.next()
            wait += time.perf_counter() - t
            if batch is None:
                break
            if t_first is None:
                t_first = time.time()
                wait = 0.0  # count waiting after the first batch only
                lens = batch.lengths
                if int(lens.sum()) != batch.nbytes:
                    print("consumer: nbytes %d != sum of lengths %d" % (batch.nbytes, int(lens.sum())), file=sys.stderr)
            if a.touch == "sum":
                check ^= touch_sum(batch)
            elif a.touch == "copy":
                scratch = touch_copy(batch, scratch)
            batches += 1
            samples += len(batch)
            nbytes += batch.nbytes
            batch.release()
            del batch
            if a.max_batches and batches >= a.max_batches:
                break
    except Exception as e:  # noqa: BLE001 - reported to the parent
        print(json.dumps({"error": "next: %s: %s" % (type(e).__name__, e)}), flush=True)
        return
    t_last = time.time()
    print(json.dumps({"t_call": t_call, "t_attached": t_attached, "t_first": t_first, "t_last": t_last, "batches": batches, "samples": samples, "bytes": nbytes, "wait_s": wait, "check": check, "cpu_s": sum(os.times()[:2]) - cpu0, "status": proc_status("self") or {}}), flush=True)


# ---------------------------------------------------------------------------
# PyTorch DataLoader


def dataloader_main(a):
    """The DataLoader baseline, in its own process (so its RSS is its own)."""
    t_start = time.time()
    import torch
    from torch.utils.data import DataLoader, Dataset

    t_imported = time.time()
    paths = []
    for d, dirs, files in os.walk(a.dir):
        dirs.sort()
        paths += [os.path.join(d, f) for f in sorted(files)]

    class FileDataset(Dataset):
        def __init__(self, paths):
            self.paths = paths

        def __len__(self):
            return len(self.paths)

        def __getitem__(self, i):
            with open(self.paths[i], "rb", buffering=0) as f:
                buf = bytearray(os.fstat(f.fileno()).st_size)
                f.readinto(buf)
            return torch.frombuffer(buf, dtype=torch.uint8)

    t_listed = time.time()
    torch.manual_seed(0)
    loader = DataLoader(FileDataset(paths), batch_size=a.batch_size, shuffle=True, num_workers=a.workers, drop_last=True)
    t_ready = time.time()
    if a.wait_go:
        # Like a ringfeed consumer waiting in attach: everything is built,
        # and the clock starts when the bench says go (a line on stdin).
        print("READY", flush=True)
        sys.stdin.readline()
    t_iter = time.time()
    t_first = None
    batches = nbytes = samples = 0
    for x in loader:
        if t_first is None:
            t_first = time.time()
        batches += 1
        samples += x.shape[0]
        nbytes += x.numel() * x.element_size()
        del x
        if a.max_batches and batches >= a.max_batches:
            break
    t_last = time.time()
    print(json.dumps({"t_start": t_start, "t_imported": t_imported, "t_listed": t_listed, "t_ready": t_ready, "t_iter": t_iter, "t_first": t_first, "t_last": t_last, "batches": batches, "samples": samples, "bytes": nbytes}), flush=True)


def run_dataloader(args, root, batch, label):
    cmd = [sys.executable, os.path.abspath(__file__), "_dataloader", "--dir", root, "--batch-size", str(batch), "--workers", str(args.dl_workers), "--max-batches", str(args.dl_max_batches)]
    note_cmd([sys.executable, "bench/loader_bench.py"] + cmd[2:])
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    sampler = RssSampler(p.pid, with_children=True, interval=0.1)
    sampler.start()
    out, _ = p.communicate()
    sampler.stop()
    try:
        r = json.loads(out.strip().splitlines()[-1])
    except (ValueError, IndexError):
        log("dataloader %s failed: rc %s, output %r" % (label, p.returncode, out[-500:]))
        return {"label": label, "ok": False}
    res = {
        "label": label,
        "ok": p.returncode == 0,
        "batch": batch,
        "bytes": r["bytes"],
        "samples": r["samples"],
        "gbps_first_last": gbs(r["bytes"], r["t_last"] - r["t_first"]),
        "gbps_from_iter": gbs(r["bytes"], r["t_last"] - r["t_iter"]),
        "ttfb_iter": r["t_first"] - r["t_iter"],
        "rss_sum_peak": sampler.peak.get("VmRSS", 0),
        "anon_sum_peak": sampler.peak.get("RssAnon", 0),
        "shmem_sum_peak": sampler.peak.get("RssShmem", 0),
        "procs": sampler.max_procs,
    }
    log("%-28s B=%d workers=%d: %.2f GB/s first->last (%.2f from iter()), RSS sum peak %.0f MiB over %d procs" % (label, batch, args.dl_workers, res["gbps_first_last"], res["gbps_from_iter"], res["rss_sum_peak"] / MiB, res["procs"]))
    return res


# ---------------------------------------------------------------------------
# fio


def fio_result(label, cmd, out_json, expected):
    note_cmd(cmd)
    t = time.time()
    p = subprocess.run(cmd, capture_output=True, text=True)
    wall = time.time() - t
    try:
        with open(out_json) as f:
            txt = f.read()
        j = json.loads(txt[txt.index("{") :])
        jobs = j["jobs"]
        io_bytes = sum(job["read"]["io_bytes"] for job in jobs)
        runtime_ms = max(job["read"]["runtime"] for job in jobs)
        errors = sum(job.get("error", 0) for job in jobs)
    except (OSError, ValueError, KeyError) as e:
        log("fio %s failed (%s): rc %d %s" % (label, e, p.returncode, p.stderr[-500:]))
        return {"label": label, "ok": False}
    res = {"label": label, "ok": p.returncode == 0 and errors == 0 and io_bytes == expected, "bytes": io_bytes, "expected": expected, "gbps_fio": gbs(io_bytes, runtime_ms / 1000.0), "gbps_wall": gbs(io_bytes, wall), "wall": wall}
    log("fio %-26s %.2f GB/s (fio runtime), %.2f GB/s wall %.1f s, read %d of %d bytes%s" % (label, res["gbps_fio"], res["gbps_wall"], wall, io_bytes, expected, "" if res["ok"] else " (NOT counted: rc %d, errors %d)" % (p.returncode, errors)))
    return res


def run_fio(args, root, n, size, label, extra, cold):
    """fio over every file of the dataset: bs = the file size (bs_unaligned),
    so each file is one read; fio's default invalidate=1 drops the files'
    cached pages first, so warm runs pass --invalidate=0."""
    out_json = os.path.join(args.data_dir, "fio-%s.json" % label)
    cmd = ["fio", "--name=" + label, "--opendir=" + root, "--rw=read", "--bs=%d" % size, "--bs_unaligned=1"]
    cmd += ["--invalidate=1" if cold else "--invalidate=0"] + list(extra)
    cmd += ["--output-format=json", "--output=" + out_json]
    if cold:
        drop_caches()
    return fio_result(label, cmd, out_json, n * size)


def run_fio_shards(args, root, n, size, label, engine, cold, iodepth=1):
    """One fio job (thread) per shard directory, all at once: 100 readers of
    1000 files each for the full dataset."""
    jobfile = os.path.join(args.data_dir, "fio-%s.fio" % label)
    with open(jobfile, "w") as f:
        f.write("[global]\nrw=read\nbs=%d\nbs_unaligned=1\nioengine=%s\niodepth=%d\nopenfiles=8\nthread=1\ngroup_reporting=1\ninvalidate=%d\n" % (size, engine, iodepth, 1 if cold else 0))
        for s in sorted(os.listdir(root)):
            f.write("[%s]\nopendir=%s\n" % (s, os.path.join(root, s)))
    out_json = os.path.join(args.data_dir, "fio-%s.json" % label)
    cmd = ["fio", "--output-format=json", "--output=" + out_json, jobfile]
    if cold:
        drop_caches()
    res = fio_result(label, cmd, out_json, n * size)
    res["jobfile"] = jobfile
    return res


FIO_CONFIGS = [
    # (label, extra args); every one reads each file once, fully (checked: io_bytes == dataset bytes).
    ("uring-qd64-seq", ["--ioengine=io_uring", "--iodepth=64", "--openfiles=256", "--file_service_type=sequential"]),
    ("uring-qd256-seq", ["--ioengine=io_uring", "--iodepth=256", "--openfiles=512", "--file_service_type=sequential"]),
    ("uring-qd64-rr", ["--ioengine=io_uring", "--iodepth=64", "--openfiles=256", "--file_service_type=roundrobin"]),
]


# ---------------------------------------------------------------------------
# the parts


def part_cold(args, R):
    n = args.cold_files or args.files
    root = ensure_dataset(args.data_dir, SIZE_BIG, n)
    R["cold_files"] = n
    rows, fio_rows = [], []
    # One untimed cold run first: on the test VM the first cold pass after a
    # while of other work ran at half speed for ringfeed and fio alike.
    drop_caches()
    run_ringfeed(args, root, 64, 1, label="cold warm-up (untimed)")
    for rep in range(args.cold_reps):
        for io, shuffle in (("uring", True), ("pread", True), ("uring", False)):
            drop_caches()
            rows.append(run_ringfeed(args, root, 64, 1, io=io, shuffle=shuffle, label="cold ringfeed --io " + io + ("" if shuffle else " --no-shuffle")))
        for i, (label, extra) in enumerate(FIO_CONFIGS):
            if (args.quick and i > 0) or (rep > 0 and i >= 2):
                continue  # the first two fio configurations are repeated; the others run once
            fio_rows.append(run_fio(args, root, n, SIZE_BIG, "cold-" + label, extra, cold=True))
        if not args.quick:  # repeated too: the goal compares against the best median
            fio_rows.append(run_fio_shards(args, root, n, SIZE_BIG, "cold-psync-job-per-shard", "psync", cold=True))
    R["cold"] = rows
    R["cold_fio"] = fio_rows


DEFAULT_QD = 256  # serve's default --queue-depth (engine/src/cli/serve.rs); the default K depends on B and the slot size


def part_warm(args, R):
    n = args.files
    ns = args.small_files or n
    big = ensure_dataset(args.data_dir, SIZE_BIG, n)
    small = ensure_dataset(args.data_dir, SIZE_SMALL, ns)
    warm_cache(big, n, SIZE_BIG)
    warm_cache(small, ns, SIZE_SMALL)
    # An untimed ringfeed epoch as well (also pages in the binary and the ring).
    run_ringfeed(args, big, 64, 1, label="warm-up (untimed)")
    run_ringfeed(args, small, args.small_batch, 1, label="warm-up (untimed)")
    # (None, None): serve's defaults (no flag); the sweep names K and qd.
    grid = [(None, None)] + ([] if args.quick else [(k, qd) for qd in (64, 256, 512) for k in (4, 8)])
    big_rows, small_rows, touch_rows = [], [], []
    # Interleave repetitions so that slow phases of the machine hit every configuration alike.
    for rep in range(max(args.reps, args.sweep_reps)):
        for w in (1, 2):
            for k, qd in grid:
                if rep < (args.reps if k is None else args.sweep_reps):
                    big_rows.append(run_ringfeed(args, big, 64, w, slots=k, qd=qd, label="100KB"))
        for w in (1, 2):
            for k, qd in grid:
                if rep < (args.reps if k is None else args.sweep_reps):
                    small_rows.append(run_ringfeed(args, small, args.small_batch, w, slots=k, qd=qd, label="4KiB"))
        if rep < args.sweep_reps:
            for w in (1, 2):
                for t in ("sum", "copy"):
                    touch_rows.append(run_ringfeed(args, big, 64, w, touch=t, label="100KB touch"))
    fio_warm = [run_fio(args, big, n, SIZE_BIG, "warm-" + FIO_CONFIGS[0][0], FIO_CONFIGS[0][1], cold=False)]
    if not args.quick:
        fio_warm.append(run_fio_shards(args, big, n, SIZE_BIG, "warm-psync-job-per-shard", "psync", cold=False))
    R["warm"] = {"big": big_rows, "small": small_rows, "touch": touch_rows, "fio": fio_warm}


def part_dataloader(args, R):
    n = args.files
    ns = args.small_files or n
    big = ensure_dataset(args.data_dir, SIZE_BIG, n)
    small = ensure_dataset(args.data_dir, SIZE_SMALL, ns)
    warm_cache(big, n, SIZE_BIG)  # the comparison is warm too (no-op right after the warm part)
    warm_cache(small, ns, SIZE_SMALL)
    rows = []
    for rep in range(args.dl_reps):
        rows.append(run_dataloader(args, big, 64, "DataLoader 100KB"))
        rows.append(run_dataloader(args, small, args.small_batch, "DataLoader 4KiB"))
    R["dataloader"] = rows


def part_ttfb(args, R):
    n = args.files
    ns = args.small_files or n
    big = ensure_dataset(args.data_dir, SIZE_BIG, n)
    small = ensure_dataset(args.data_dir, SIZE_SMALL, ns)
    warm_cache(big, n, SIZE_BIG)
    warm_cache(small, ns, SIZE_SMALL)
    out = {}
    # The third workload keeps the first step (W x B samples, all of which
    # the loader must read before the last rank has its batch) at 512
    # samples while W grows: it separates the number of consumers from the
    # bytes of their first batches; 16 and 32 consumers go beyond the 8 GPUs
    # of a typical machine to show what more consumers alone cost.
    workloads = (
        (big, SIZE_BIG, "100 KB B=64", ((1, 64), (2, 64), (8, 64))),
        (small, SIZE_SMALL, "4 KiB B=%d" % args.small_batch, ((1, args.small_batch), (2, args.small_batch), (8, args.small_batch))),
        (big, SIZE_BIG, "100 KB W×B=512", ((1, 512), (2, 256), (8, 64), (16, 32), (32, 16))),
    )
    for root, size, label, configs in workloads:
        run_ringfeed(args, root, configs[0][1], 1, max_batches=3, kill_after=True, label="ttfb warm-up (untimed)")
        for w, batch in configs:
            runs = []
            for rep in range(args.ttfb_reps):
                r = run_ringfeed(args, root, batch, w, max_batches=3, kill_after=True, label="ttfb")
                runs.append({"ttfb": sorted(r["ttfb"]), "from_start": sorted(r["ttfb_from_start"]), "manifest": r["t_manifest"], "cached": r["manifest_cached"], "ring": r["t_ring"], "k": r["slots"], "attached": sorted(r["attached"]), "loader": r["loader_first_batches"]})
            out["%s W=%d" % (label, w)] = {"w": w, "batch": batch, "workload": label, "step_bytes": w * batch * size, "runs": runs}
    R["ttfb"] = out
    first = {}
    for root, label, batch in ((big, "100 KB B=64", 64), (small, "4 KiB B=%d" % args.small_batch, args.small_batch)):
        for w in (1, 2, 8):
            runs = [r for r in (run_serve_first(args, root, batch, w) for _ in range(args.ttfb_reps)) if r]
            first["%s W=%d" % (label, w)] = {"w": w, "workload": label, "runs": runs}
            if runs:
                log("serve first, %s W=%d: last rank %.1f ms after go (median of %d)" % (label, w, 1000 * med([x["after_go"][-1] for x in runs]), len(runs)))
    R["ttfb_serve_first"] = first


def run_dataloader_ranks(args, root, batch, world):
    """W DataLoader processes, as W torchrun ranks each with its own
    DataLoader: each imports torch, lists the files and builds its loader,
    then waits; once all are ready the bench says go to all at once, and
    each records when its first batch came."""
    cmd = [sys.executable, os.path.abspath(__file__), "_dataloader", "--dir", root, "--batch-size", str(batch), "--workers", str(args.dl_workers), "--max-batches", "1", "--wait-go"]
    note_cmd([sys.executable, "bench/loader_bench.py"] + cmd[2:])
    t_launch = time.time()
    procs = [subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True) for _ in range(world)]
    t_go = go_together(procs)
    if t_go is None:
        for q in procs:
            q.kill()
            q.wait()
        log("dataloader rank failed before it was ready")
        return None
    out = []
    for p in procs:
        text, _ = p.communicate()
        try:
            out.append(json.loads(text.strip().splitlines()[-1]))
        except (ValueError, IndexError):
            log("dataloader rank failed: rc %s, output %r" % (p.returncode, text[-300:]))
            return None
    return {
        "after_go": sorted(r["t_first"] - t_go for r in out),
        "from_launch": sorted(r["t_first"] - t_launch for r in out),
        "ready": max(r["t_ready"] for r in out) - t_launch,
        "listing": statistics.median(r["t_listed"] - r["t_imported"] for r in out),
    }


def part_dlttfb(args, R):
    n = args.files
    big = ensure_dataset(args.data_dir, SIZE_BIG, n)
    warm_cache(big, n, SIZE_BIG)
    out = {}
    for w in (1, 2, 8):
        runs = []
        for _ in range(args.dl_ttfb_reps):
            r = run_dataloader_ranks(args, big, 64, w)
            if r:
                runs.append(r)
                log("DataLoader ranks W=%d: first batch %.1f / %.1f ms after go (first / last rank), last rank %.2f s after launch" % (w, 1000 * r["after_go"][0], 1000 * r["after_go"][-1], r["from_launch"][-1]))
        out[w] = runs
    R["dlttfb"] = out


# ---------------------------------------------------------------------------
# report


def fmt_gb(x):
    return "%.2f" % x if x == x else "n/a"


def mib(x):
    return "%.0f" % (x / MiB)


def med(xs):
    xs = [x for x in xs if x == x]
    return statistics.median(xs) if xs else float("nan")


def groups(rows, keys=("world", "slots", "qd", "touch", "io", "shuffle")):
    """Rows of the same configuration together: median and best GB/s, and the
    run closest to the median (its RSS and CPU figures are shown)."""
    out = {}
    for r in rows:
        if r.get("ok"):
            out.setdefault(tuple(r[k] for k in keys), []).append(r)
    res = []
    for key, rs in out.items():
        vals = [r["gbps_first_last"] for r in rs]
        m = med(vals)
        rep = min(rs, key=lambda r: abs(r["gbps_first_last"] - m))
        res.append(dict(zip(keys, key), default=any(r.get("default") for r in rs), n=len(rs), med=m, best=max(vals), med_start=med([r["gbps_from_start"] for r in rs]), rep=rep, all=vals))
    return res


def fio_groups(rows):
    out = {}
    for f in rows:
        if f.get("ok"):
            out.setdefault(f["label"], []).append(f)
    return [{"label": k, "n": len(v), "med": med([f["gbps_fio"] for f in v]), "best": max(f["gbps_fio"] for f in v), "med_wall": med([f["gbps_wall"] for f in v]), "bytes": v[0]["bytes"], "expected": v[0]["expected"]} for k, v in out.items()]


def machine():
    mem = 0
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemTotal:"):
                mem = int(line.split()[1]) * 1024
    cpu = ""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return "nproc %d, RAM %.1f GiB, kernel %s, %s, Python %s" % (os.cpu_count(), mem / (1 << 30), platform.release(), cpu, platform.python_version())


def report(args, R):
    L = []
    L.append("# ringfeed loader benchmark")
    L.append("")
    L.append("- date: %s" % datetime.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M:%S %Z"))
    L.append("- machine: %s" % machine())
    L.append("- ringfeed: `%s` (git %s); consumers load `%s`" % (args.bin, git_rev(), args.binding))
    L.append("- data: %s; 100 KB = %d bytes, 4 KiB = %d bytes; %d files each%s (shards of %d per directory)" % (args.data_dir, SIZE_BIG, SIZE_SMALL, args.files, "" if not args.small_files else " (4 KiB: %d)" % args.small_files, SHARD))
    L.append("- run: `%s` (%.0f s)" % (" ".join(shlex.quote(a) for a in [sys.executable] + sys.argv), R.get("elapsed", 0)))
    L.append("- GB/s = sample bytes delivered to the consumers ÷ time from the first batch to the last (any rank), GB = 1e9 B. 'from start' counts from launching `ringfeed serve` (includes building the manifest: listing the dataset on the first run over it, reading the manifest cache on later runs). 'med' = median over runs, 'best' = fastest run. Every run is one epoch.")
    L.append("- consumer: one Python process per rank, `for batch in ringfeed.attach(...)`, `batch.release()`; 'none' touches no byte (zero copy), 'sum' = numpy sum over every byte of the batch (uint64 view), 'copy' = np.copyto of the batch into private memory.")
    L.append("")
    mems = [m for m in (R.get("memcpy"), R.get("memcpy_end")) if m]
    mem = max((m["memcpy_GBps"] for m in mems), default=None)
    if mems:
        L.append("## memcpy")
        L.append("")
        L.append("numpy copy of 1 GiB, one thread, best of 3 (bytes copied per second; memory traffic is twice that): " + ", ".join("%s **%.2f GB/s** (libc memmove %.2f)" % (w, m["memcpy_GBps"], m["memmove_GBps"]) for w, m in zip(("at start", "at end"), mems)) + ". The goal below uses the higher numpy figure.")
        L.append("")
        L.append("First touch of fresh shared memory (a new /dev/shm file of 256 MiB mapped with MAP_POPULATE: allocate, zero and map every page; median of 3): " + ", ".join("%s %.2f GB/s" % (w, m["first_touch_GBps"]) for w, m in zip(("at start", "at end"), mems) if "first_touch_GBps" in m) + ". Every page of a ring is touched for the first time once, on the first pass over its slots: a rough cost for the first batches (the loader, allocating one slot at a time, has done the first step a little faster than this rate).")
        L.append("")
    warm = R.get("warm")
    dls = {}
    for d in R.get("dataloader", []):
        if d.get("ok"):
            dls.setdefault(d["label"], []).append(d)
    if warm:
        L.append("## Warm page cache, 100 KB files (B=64, shuffle)")
        L.append("")
        L.append("| W | K (slots/rank) | queue depth | consumer | runs | GB/s med | GB/s best | GB/s from serve start (med) | serve CPU, cores | consumer waits in next() | serve VmHWM MiB | ring MiB | serve RssAnon / RssShmem MiB | consumer RssAnon / RssShmem MiB |")
        L.append("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
        big = groups(warm["big"])
        touch = groups(warm["touch"])
        for w in (1, 2):
            mine = [g for g in big if g["world"] == w]
            dflt = [g for g in mine if g["default"]]
            best = max(mine, key=lambda g: g["med"], default=None)
            show = dflt + ([best] if best and best not in dflt else []) + [g for g in touch if g["world"] == w]
            for g in show:
                r = g["rep"]
                tag = " (default)" if g["default"] else " (best)"
                L.append(
                    "| %d | %s | %s%s | %s | %d | %s | %s | %s | %.2f | %.0f%% | %s | %s | %s / %s | %s / %s |"
                    % (w, g["slots"], g["qd"], tag, g["touch"], g["n"], fmt_gb(g["med"]), fmt_gb(g["best"]), fmt_gb(g["med_start"]), r["serve_cpu_cores"], 100 * r["wait_frac"], mib(r["serve_hwm"]), mib(r["ring_bytes"]), mib(r["serve_anon_peak"]), mib(r["serve_shmem_peak"]), mib(r["cons_anon"]), mib(r["cons_shmem"]))
                )
        L.append("")
        if len(big) > 2:
            L.append("Sweep, GB/s median (runs) for 100 KB:")
            L.append("")
            L.append(sweep_table(big))
            L.append("")
        for f in fio_groups(warm["fio"]):
            L.append("fio over the same warm files, `%s`: %s GB/s (fio's runtime; %s GB/s wall incl. its file setup), read %d of %d bytes." % (f["label"], fmt_gb(f["med"]), fmt_gb(f["med_wall"]), f["bytes"], f["expected"]))
            L.append("")
        L.append("## Warm page cache, 4 KiB files (B=%d, shuffle)" % args.small_batch)
        L.append("")
        small = groups(warm["small"])
        L.append("| W | K | queue depth | runs | GB/s med | samples/s med | GB/s best | GB/s from serve start (med) | serve CPU, cores |")
        L.append("|---|---|---|---|---|---|---|---|---|")
        for w in (1, 2):
            mine = [g for g in small if g["world"] == w]
            dflt = [g for g in mine if g["default"]]
            best = max(mine, key=lambda g: g["med"], default=None)
            for g in dflt + ([best] if best and best not in dflt else []):
                tag = " (default)" if g["default"] else " (best)"
                L.append("| %d | %s | %s%s | %d | %s | %.0f | %s | %s | %.2f |" % (w, g["slots"], g["qd"], tag, g["n"], fmt_gb(g["med"]), g["med"] * GB / SIZE_SMALL, fmt_gb(g["best"]), fmt_gb(g["med_start"]), g["rep"]["serve_cpu_cores"]))
        L.append("")
        if len(small) > 2:
            L.append("Sweep, GB/s median (runs) for 4 KiB:")
            L.append("")
            L.append(sweep_table(small))
            L.append("")
    if dls:
        L.append("## PyTorch DataLoader (num_workers=%d, shuffle=True, default collate, drop_last, one training process)" % args.dl_workers)
        L.append("")
        L.append("`__getitem__` opens the file, `readinto` a bytearray, returns `torch.frombuffer`; the main process iterates every batch. RSS = sum over the main process and its workers, peak (sampled every 100 ms).")
        L.append("")
        L.append("| files | runs | GB/s med | GB/s best | samples/s med | GB/s from iter() | first batch after iter() s | RSS sum peak MiB (procs) | RssAnon sum MiB | RssShmem sum MiB |")
        L.append("|---|---|---|---|---|---|---|---|---|---|")
        for label, ds in dls.items():
            m = med([d["gbps_first_last"] for d in ds])
            size = SIZE_BIG if "100KB" in label else SIZE_SMALL
            d = ds[0]
            L.append("| %s | %d | %s | %s | %.0f | %s | %.2f | %s (%d) | %s | %s |" % (label.replace("DataLoader ", ""), len(ds), fmt_gb(m), fmt_gb(max(x["gbps_first_last"] for x in ds)), m * GB / size, fmt_gb(med([x["gbps_from_iter"] for x in ds])), d["ttfb_iter"], mib(d["rss_sum_peak"]), d["procs"], mib(d["anon_sum_peak"]), mib(d["shmem_sum_peak"])))
        L.append("")
        if warm:
            g1 = next((g for g in groups(warm["big"]) if g["world"] == 1 and g["default"]), None)
            if g1:
                r = g1["rep"]
                L.append("Memory, same workload: DataLoader main + 2 workers %s MiB RSS (%s MiB anonymous) vs ringfeed serve %s MiB VmHWM (%s MiB of it the ring, RssShmem) + the consumer %s MiB anonymous (%s MiB of ring pages mapped, RssShmem). The DataLoader figure includes torch in 3 processes; the ringfeed consumer imports numpy only." % (mib(dls["DataLoader 100KB"][0]["rss_sum_peak"]) if "DataLoader 100KB" in dls else "?", mib(dls["DataLoader 100KB"][0]["anon_sum_peak"]) if "DataLoader 100KB" in dls else "?", mib(r["serve_hwm"]), mib(r["serve_shmem_peak"]), mib(r["cons_anon"]), mib(r["cons_shmem"])))
                L.append("")
    cold = R.get("cold")
    if cold:
        n = R["cold_files"]
        L.append("## Cold page cache: %d files of 100 KB (%.1f GB); `sync; echo 3 > /proc/sys/vm/drop_caches` before every run" % (n, n * SIZE_BIG / GB))
        L.append("")
        L.append("| reader | runs | GB/s med (ringfeed: first→last batch; fio: its runtime) | GB/s best | GB/s wall med (from serve launch / fio launch) | bytes |")
        L.append("|---|---|---|---|---|---|")
        for g in groups(cold):
            L.append("| ringfeed serve W=1 B=64 --io %s%s | %d | %s | %s | %s | %d |" % (g["io"], "" if g["shuffle"] else " --no-shuffle (manifest order)", g["n"], fmt_gb(g["med"]), fmt_gb(g["best"]), fmt_gb(g["med_start"]), g["rep"]["bytes"]))
        for f in fio_groups(R.get("cold_fio", [])):
            L.append("| fio %s | %d | %s | %s | %s | %d of %d |" % (f["label"], f["n"], fmt_gb(f["med"]), fmt_gb(f["best"]), fmt_gb(f["med_wall"]), f["bytes"], f["expected"]))
        L.append("")
        L.append("ringfeed serves whole steps only: %d of %d samples per epoch (the tail that does not fill a batch is dropped)." % (groups(cold)[0]["rep"]["samples"] if groups(cold) else 0, n))
        L.append("")
    tt = R.get("ttfb")
    if tt:
        L.append("## Time to first batch")
        L.append("")
        L.append("W consumers start first and wait in `ringfeed.attach`; then `ringfeed serve` starts (warm page cache, default K and queue depth). The manifest is already built: an untimed warm-up run per workload lists the dataset and stores it in the manifest cache (RINGFEED_CACHE_DIR, DATA_DIR/cache unless set), and every timed run reads it from there (the last column counts the runs whose manifest line said so). T0 = the moment serve prints `ringfeed: manifest: ...` (what follows is ring creation, reader start and the reads); 'from serve launch' counts from the moment the bench starts the serve process instead, so it includes process start and reading and checking the cached manifest. Each consumer records `time.time()` when `attach` returns and at its first batch ('attach returned': the consumer holds its feed and can call next(); the loader's segment is ready about 1 ms after T0). Per run: the first rank served (min), the median rank and the last rank (max), ms after T0; the table gives the median of each over the runs. 'serve: first / all' is the loader's own view, from its log line `first batch of every rank published`: when the first and the last rank's first batch were published, ms after the ring was created (T0 plus 'ring + reader start'), before any consumer is scheduled to take them (each column is a median of its own, so columns need not add up). 'first step' = the bytes all W first batches hold together (W x B x sample size), which the loader must read before the last rank has its batch. The workload `100 KB W×B=512` holds the first step at 512 samples (51 MB) while W grows from 1 to 32 (B = 512/W): it separates the number of consumers from the bytes of their first batches.")
        L.append("")
        L.append("| workload | W | B | runs | K | ring + reader start ms | serve: first / all ranks' first batch published, ms after the ring | attach returned, last rank ms | first rank ms | median rank ms | last rank ms | first step MB | first / last rank ms from serve launch | manifest line ms after launch | runs with the manifest from the cache |")
        L.append("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
        for label, d in tt.items():
            runs = [x for x in d["runs"] if x["ttfb"]]
            if not runs:
                continue
            lo = [x["loader"] for x in runs if x.get("loader")]
            L.append("| %s | %d | %d | %d | %s | %.1f | %s | %.1f | %.1f | %.1f | %.1f | %.1f | %.1f / %.1f | %.1f | %d of %d |" % (
                d["workload"], d["w"], d.get("batch", 0), len(runs), runs[0]["k"],
                1000 * med([x["ring"] for x in runs]),
                "%.1f / %.1f" % (1000 * med([x[0] for x in lo]), 1000 * med([x[1] for x in lo])) if lo else "-",
                1000 * med([x["attached"][-1] for x in runs if x.get("attached")]),
                1000 * med([x["ttfb"][0] for x in runs]),
                1000 * med([statistics.median(x["ttfb"]) for x in runs]),
                1000 * med([x["ttfb"][-1] for x in runs]),
                d["step_bytes"] / 1e6,
                1000 * med([x["from_start"][0] for x in runs]),
                1000 * med([x["from_start"][-1] for x in runs]),
                1000 * med([x["manifest"] for x in runs]),
                sum(1 for x in runs if x.get("cached")), len(runs)))
        L.append("")
        for label, d in tt.items():
            if d["w"] == 8:
                L.append("%s: first batch of each rank, sorted, ms after T0, per run: %s" % (label, " | ".join(", ".join("%.1f" % (1000 * t) for t in x["ttfb"]) for x in d["runs"])))
                L.append("")
    sf = R.get("ttfb_serve_first")
    if sf:
        L.append("## Time to first batch, serve started first")
        L.append("")
        L.append("The order the README shows (`ringfeed serve ... &`, then torchrun): serve starts and reads its cached manifest; once it logs that every rank's first batch is published, W consumer processes start, import numpy and ringfeed, print READY and wait on stdin; when all are ready the bench writes `go` to each, and each calls `ringfeed.attach` and takes its first batch. 'after go' runs from that write to the batch in hand (attach included); 'attach call' from the consumer's own call, the loader's part: with 8 consumers most of 'after go' is 8 Python processes woken at once waiting for a turn on the cores (as much for 4 KiB files, whose whole ring is 33 MB, as for 100 KB). Medians over runs.")
        L.append("")
        L.append("| workload | W | runs | first rank ms after go | last rank ms after go | attach call to first batch, last rank ms |")
        L.append("|---|---|---|---|---|---|")
        for label, d in sf.items():
            runs = d["runs"]
            if not runs:
                continue
            L.append("| %s | %d | %d | %.2f | %.2f | %.2f |" % (d["workload"], d["w"], len(runs), 1000 * med([x["after_go"][0] for x in runs]), 1000 * med([x["after_go"][-1] for x in runs]), 1000 * med([x["call_to_first"][-1] for x in runs])))
        L.append("")
    dt = R.get("dlttfb")
    if dt:
        L.append("## Time to first batch with W DataLoader ranks (num_workers=%d each, B=64, 100 KB, warm)" % args.dl_workers)
        L.append("")
        L.append("What W torchrun ranks do today: each imports torch, lists the files (`os.walk`, sorted), builds its own DataLoader, then waits, as a ringfeed consumer waits in attach; when all W are ready the bench writes `go` to each one's stdin, and each records its first batch (the worker processes start at the first `iter()`). 'after go' is the counterpart of ringfeed's 'after the manifest line' above; 'from launch' includes importing torch and listing 100,000 files in every rank. Medians over runs.")
        L.append("")
        L.append("| W | runs | first rank ms after go | last rank ms after go | last rank s from launch | all ranks ready, s from launch | listing in each rank, s |")
        L.append("|---|---|---|---|---|---|---|")
        for w, runs in dt.items():
            if not runs:
                continue
            L.append("| %d | %d | %.1f | %.1f | %.2f | %.2f | %.2f |" % (
                int(w), len(runs),
                1000 * med([x["after_go"][0] for x in runs]),
                1000 * med([x["after_go"][-1] for x in runs]),
                med([x["from_launch"][-1] for x in runs]),
                med([x["ready"] for x in runs]),
                med([x["listing"] for x in runs])))
        L.append("")
    # goals
    G = []
    if warm:
        big = groups(warm["big"])
        g_def = next((g for g in big if g["world"] == 1 and g["default"]), None)
        g_best = max((g for g in big if g["world"] == 1), key=lambda g: g["med"], default=None)
        d100 = med([d["gbps_first_last"] for d in dls.get("DataLoader 100KB", [])])
        if g_def and d100 == d100:
            G.append("- **≥5x the DataLoader, warm 100 KB**: ringfeed W=1 default %.2f GB/s (best config K=%s qd=%s: %.2f) vs DataLoader %.2f GB/s (medians) = **%.1fx** (%.1fx) → %s" % (g_def["med"], g_best["slots"], g_best["qd"], g_best["med"], d100, g_def["med"] / d100, g_best["med"] / d100, "met" if g_def["med"] / d100 >= 5 else ("met only with tuning" if g_best["med"] / d100 >= 5 else "NOT met")))
        small = groups(warm["small"])
        s_def = next((g for g in small if g["world"] == 1 and g["default"]), None)
        d4 = med([d["gbps_first_last"] for d in dls.get("DataLoader 4KiB", [])])
        if s_def and d4 == d4:
            G.append("- (4 KiB, for reference) ringfeed W=1 default %.3f GB/s vs DataLoader %.3f GB/s = %.1fx" % (s_def["med"], d4, s_def["med"] / d4))
        if g_def and mem:
            G.append("- **≥50%% of memcpy, warm 100 KB**: default %.2f / %.2f GB/s = **%.0f%%**, best config %.0f%% → %s" % (g_def["med"], mem, 100 * g_def["med"] / mem, 100 * g_best["med"] / mem, "met" if g_def["med"] / mem >= 0.5 else ("met only with tuning" if g_best["med"] / mem >= 0.5 else "NOT met")))
        allr = [r for r in warm["big"] + warm["touch"] + warm["small"] if r.get("ok") and r["ring_bytes"]]
        worst = max(allr, key=lambda r: r["serve_hwm"] - r["ring_bytes"], default=None)
        if worst:
            over = worst["serve_hwm"] - worst["ring_bytes"]
            G.append("- serve VmHWM ≤ ring + 64 MiB: worst warm run VmHWM %s MiB with a %s MiB ring → %s MiB over the ring → %s" % (mib(worst["serve_hwm"]), mib(worst["ring_bytes"]), mib(over), "met" if over <= 64 * MiB else "NOT met"))
    if cold:
        fios = fio_groups(R.get("cold_fio", []))
        fb = max(fios, key=lambda f: f["med"], default=None)
        for shuffle in (False, True):
            rf = max((g for g in groups(cold) if g["shuffle"] == shuffle), key=lambda g: g["med"], default=None)
            if not (rf and fb):
                continue
            x = rf["med"] / fb["med"]
            what = "in manifest order (--no-shuffle: sorted paths, the order the files were written in)" if not shuffle else "shuffled (each batch 64 files from anywhere in the dataset)"
            G.append("- **≥90%% of fio, cold**, ringfeed %s: --io %s %.2f GB/s vs the best fio configuration (%s) %.2f GB/s (medians) = **%.0f%%** → %s. Wall clock from launch (ringfeed reads its cached manifest first, from a cold page cache too): %.2f vs %.2f GB/s = %.0f%%" % (what, rf["io"], rf["med"], fb["label"], fb["med"], 100 * x, "met" if x >= 0.9 else "NOT met", rf["med_start"], fb["med_wall"], 100 * rf["med_start"] / fb["med_wall"]))
    if tt:
        touch = min((m["first_touch_GBps"] for m in mems if "first_touch_GBps" in m), default=None)
        for wl in dict.fromkeys(d["workload"] for d in tt.values()):
            row = [(d["w"], med([x["ttfb"][-1] for x in d["runs"] if x["ttfb"]]), med([x["ttfb"][0] for x in d["runs"] if x["ttfb"]]), d["step_bytes"]) for d in tt.values() if d["workload"] == wl]
            if not row:
                continue
            line = "- time to first batch, %s (medians over runs, ms after the manifest is built): first rank " % wl + ", ".join("W=%d %.1f" % (w, 1000 * first) for w, _, first, _ in row)
            line += "; last rank " + ", ".join("W=%d %.1f" % (w, 1000 * last) for w, last, _, _ in row)
            if touch:
                line += "; last rank minus the first step's bytes at the first-touch rate of fresh shared memory (%.2f GB/s): " % touch + ", ".join("W=%d %.1f" % (w, 1000 * (last - step / (touch * GB))) for w, last, _, step in row)
            launch = [(d["w"], med([x["from_start"][0] for x in d["runs"] if x["from_start"]]), med([x["from_start"][-1] for x in d["runs"] if x["from_start"]]),
                       sum(1 for x in d["runs"] if x.get("cached")), len(d["runs"])) for d in tt.values() if d["workload"] == wl]
            line += "; from serve launch, manifest from the cache (%d of %d runs): first rank " % (sum(c for *_, c, _ in launch), sum(n for *_, n in launch))
            line += ", ".join("W=%d %.1f" % (w, 1000 * first) for w, first, *_ in launch) + ", last rank " + ", ".join("W=%d %.1f" % (w, 1000 * last) for w, _, last, *_ in launch)
            G.append(line)
    if G:
        L.append("## Goals")
        L.append("")
        L += G
        L.append("")
    L.append("## Commands")
    L.append("")
    L.append("NAME is a fresh loader name per run (`rfbench-PID-N`); R = 0..W-1.")
    L.append("")
    L.append("```")
    L += COMMANDS
    L.append("```")
    text = "\n".join(L) + "\n"
    print("\n" + text)
    if args.results:
        with open(args.results, "w") as f:
            f.write(text)
        log("wrote %s" % args.results)
    with open(os.path.join(args.data_dir, "results.json"), "w") as f:
        json.dump(R, f, indent=1, default=str)


def sweep_table(gs):
    ks = sorted({g["slots"] for g in gs})
    qds = sorted({g["qd"] for g in gs})
    rows = ["| W | K | " + " | ".join("qd %d" % q for q in qds) + " |", "|---|---|" + "---|" * len(qds)]
    for w in sorted({g["world"] for g in gs}):
        for k in ks:
            cells = []
            for q in qds:
                g = next((g for g in gs if (g["world"], g["slots"], g["qd"]) == (w, k, q)), None)
                cells.append("%s (%d)" % (fmt_gb(g["med"]), g["n"]) if g else "")
            rows.append("| %d | %d | " % (w, k) + " | ".join(cells) + " |")
    return "\n".join(rows)


def git_rev():
    try:
        rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO, capture_output=True, text=True).stdout.strip()
        return rev + ("+dirty" if dirty else "")
    except OSError:
        return "?"


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "_consumer":
        p = argparse.ArgumentParser()
        p.add_argument("_consumer")
        p.add_argument("--name", required=True)
        p.add_argument("--rank", type=int, required=True)
        p.add_argument("--touch", choices=["none", "sum", "copy"], default="none")
        p.add_argument("--max-batches", type=int, default=0)
        p.add_argument("--wait-go", action="store_true")
        return consumer_main(p.parse_args())
    if len(sys.argv) > 1 and sys.argv[1] == "_dataloader":
        p = argparse.ArgumentParser()
        p.add_argument("_dataloader")
        p.add_argument("--dir", required=True)
        p.add_argument("--batch-size", type=int, required=True)
        p.add_argument("--workers", type=int, default=2)
        p.add_argument("--max-batches", type=int, default=0)
        p.add_argument("--wait-go", action="store_true")
        return dataloader_main(p.parse_args())
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data-dir", default="/tmp/ringfeed-bench")
    p.add_argument("--files", type=int, default=100_000, help="files per dataset (default 100000)")
    p.add_argument("--small-files", type=int, default=0, help="4 KiB files (default: --files)")
    p.add_argument("--cold-files", type=int, default=0, help="files for the cold part (default: --files); a separate dataset")
    p.add_argument("--only", default=",".join(PARTS), help="comma-separated parts: " + ",".join(PARTS))
    p.add_argument("--bin", default=os.path.join(REPO, "target", "release", "ringfeed"))
    p.add_argument("--lib", default="", help="RINGFEED_LIB for the consumers (default: the library bundled by `pip install ./bindings/python`; reinstall after rebuilding)")
    p.add_argument("--small-batch", type=int, default=256)
    p.add_argument("--reps", type=int, default=3, help="runs of each default warm configuration (median and best are reported)")
    p.add_argument("--sweep-reps", type=int, default=2, help="runs of every other warm configuration")
    p.add_argument("--cold-reps", type=int, default=2, help="runs of each cold ringfeed configuration, of the first two fio ones and of psync one job per directory")
    p.add_argument("--dl-reps", type=int, default=2, help="DataLoader runs per dataset")
    p.add_argument("--ttfb-reps", type=int, default=5)
    p.add_argument("--dl-ttfb-reps", type=int, default=3, help="runs of each W of the DataLoader time to first batch")
    p.add_argument("--dl-workers", type=int, default=2)
    p.add_argument("--dl-max-batches", type=int, default=0, help="stop the DataLoader after N batches (0: one full epoch)")
    p.add_argument("--quick", action="store_true", help="skip the sweeps and extra fio configurations")
    p.add_argument("--results", default=os.path.join(REPO, "bench", "RESULTS.md"), help="markdown output ('' for none)")
    args = p.parse_args()
    parts = [x.strip() for x in args.only.split(",") if x.strip()]
    bad = [x for x in parts if x not in PARTS]
    if bad:
        p.error("unknown part(s) %s; choose from %s" % (bad, PARTS))
    if not os.access(args.bin, os.X_OK):
        p.error("%s is not built: run `cargo build --release` first" % args.bin)
    probe = subprocess.run([sys.executable, "-c", "import ringfeed; print(ringfeed.library_path, ringfeed.abi_version())"], capture_output=True, text=True, env=lib_env(args))
    if probe.returncode != 0:
        p.error("the ringfeed binding does not load: %s\n(install it: .venv/bin/pip install ./bindings/python)" % probe.stderr.strip().splitlines()[-1:])
    args.binding = probe.stdout.strip()
    log("consumers use %s" % args.binding)
    if "cold" in parts and not shutil.which("fio"):
        log("fio is missing: apt-get install -y fio (cold fio figures will be missing)")
    os.makedirs(args.data_dir, exist_ok=True)
    R = {"args": vars(args)}
    t = time.time()
    for part in PARTS:
        if part not in parts:
            continue
        log("== %s" % part)
        if part == "memcpy":
            R["memcpy"] = bench_memcpy()
            log("memcpy %.2f GB/s (numpy copyto), %.2f GB/s (memmove)" % (R["memcpy"]["memcpy_GBps"], R["memcpy"]["memmove_GBps"]))
        else:
            globals()["part_" + part](args, R)
    if "memcpy" in parts:
        R["memcpy_end"] = bench_memcpy()
        log("memcpy at the end %.2f GB/s (numpy copyto), %.2f GB/s (memmove)" % (R["memcpy_end"]["memcpy_GBps"], R["memcpy_end"]["memmove_GBps"]))
    R["elapsed"] = time.time() - t
    log("all parts in %.0f s" % (time.time() - t))
    report(args, R)


if __name__ == "__main__":
    main()
