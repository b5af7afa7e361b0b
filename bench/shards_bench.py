#!/usr/bin/env python3
"""Small objects vs shards (issue 23, point 3; issue 22, points 1 and 2): prints figures, never asserts.

    cargo build --release -p ringfeed --bin ringfeed && cargo build --release -p faultproxy -p ringfeed-ffi
    /work/venv/bin/python bench/shards_bench.py                       # every cell, ~10 min on 2 cores
    /work/venv/bin/python bench/shards_bench.py --cells raw,block --objects 20000

One path: nginx (WebDAV) behind tests/faultproxy adding 20 ms per round trip,
the remote benchmark's path. The data: OBJECTS objects of 4 KiB (default
100,000) under raw4k/, and the same tree packed by `ringfeed pack` into tar
shards under packed4k/ (both in nginx's root). Cells, each `ringfeed serve`
with one Python consumer that touches no bytes, batch 64, 3 epochs:

  raw           the raw objects, exact order (one GET per sample)
  exact         the packed shards, exact order (one ranged GET per sample)
  block         the packed shards, --shuffle block (a batch of neighbours: one GET)
  each with --cache off, and with a fresh --cache-dir holding the whole set
  (":cache"): epoch 1 fills it, epochs 2 and 3 read it.

Figures per epoch (samples/s and MB/s, from the consumer's side, the first
batch of a cell excluded), GETs the server logged, and the CPU (cores) of
nginx and of the proxy. Results go to stdout and bench/RESULTS-shards.md.
"""

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time

BENCH = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, BENCH)
import remote_bench as rb  # noqa: E402  (servers, proxy, CPU meters)

REPO = rb.REPO
OBJ_BYTES = 4096
BATCH = 64
EPOCHS = 3
CELL_TIMEOUT_S = 900


def make_raw(root, count):
    d = os.path.join(root, "raw4k")
    if os.path.isdir(d) and sum(len(f) for _, _, f in os.walk(d)) == count:
        return d
    shutil.rmtree(d, ignore_errors=True)
    t = time.time()
    for i in range(count):
        sub = os.path.join(d, "%03d" % (i // 1000))
        if i % 1000 == 0:
            os.makedirs(sub, exist_ok=True)
        with open(os.path.join(sub, "%06d.bin" % i), "wb") as f:
            f.write(os.urandom(OBJ_BYTES))
    rb.log("made %d raw objects of %d bytes in %.1f s" % (count, OBJ_BYTES, time.time() - t))
    return d


def pack(bin_path, raw, dest, shard_size):
    cmd = [bin_path, "pack", "--source", raw, "--dest", dest, "--shard-size", shard_size]
    rb.note_cmd(cmd)
    t = time.time()
    subprocess.run(cmd, check=True)
    rb.log("packed into %s in %.1f s: %s" % (dest, time.time() - t, sorted(os.listdir(dest))[:4]))


def run_cell(bin_path, url, extra, env, lib):
    name = "sbench%d" % os.getpid()
    cmd = [bin_path, "serve", "--source", url, "--name", name, "--batch-size", str(BATCH), "--world-size", "1",
           "--epochs", str(EPOCHS)] + extra
    rb.note_cmd([c if c != name else "NAME" for c in cmd])
    serve = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True, env=env)
    lines = []
    reader = threading.Thread(target=lambda: lines.extend(l.rstrip("\n") for l in serve.stderr), daemon=True)
    reader.start()
    seg = "/dev/shm/ringfeed-" + name
    epochs = {}
    try:
        deadline = time.time() + rb.SERVE_ATTACH_TIMEOUT_S
        while not os.path.exists(seg) and time.time() < deadline:
            if serve.poll() is not None:
                reader.join(timeout=2)
                return {"error": "serve exited %s: %s" % (serve.returncode, " ".join(lines)[-300:])}
            time.sleep(0.02)
        os.environ["RINGFEED_LIB"] = lib
        import ringfeed

        feed = ringfeed.attach(name, 0, timeout=120)
        t_end = time.time() + CELL_TIMEOUT_S
        last = None
        cpu_at = {}  # epoch -> the loader's CPU seconds by thread at its first batch
        while time.time() < t_end:
            try:
                b = feed.next(timeout=120)
            except StopIteration:
                break
            if b is None:
                break
            now = time.time()
            if b.epoch not in cpu_at:
                cpu_at[b.epoch] = threads_cpu(serve.pid)
            e = epochs.setdefault(b.epoch, {"t0": last or now, "t1": now, "samples": 0, "bytes": 0})
            if last is not None:  # the first batch of the cell waits for the listing: not counted
                e["samples"] += len(b)
                e["bytes"] += b.nbytes
            e["t1"] = now
            last = now
            b.release()
        cpu_at["end"] = threads_cpu(serve.pid)
        feed.close()
        serve.wait(timeout=60)
    finally:
        if serve.poll() is None:
            serve.terminate()
            serve.wait(timeout=15)
        reader.join(timeout=2)
    # CPU seconds per 100,000 samples of epochs 1 on (epoch 0 holds the start), by thread kind.
    keys = [k for k in cpu_at if k != "end" and k >= 1] + ["end"]
    cpu = None
    if len(keys) >= 2:
        a, b = cpu_at[keys[0]], cpu_at["end"]
        n = sum(epochs[k]["samples"] for k in epochs if k >= 1)
        cpu = {t: (b.get(t, 0.0) - a.get(t, 0.0)) * 1e5 / max(n, 1) for t in b}
        cpu = {t: v for t, v in cpu.items() if v >= 0.005}
    return {"epochs": epochs, "loader_cpu": cpu, "log": [l for l in lines if "cache" in l or "tar" in l][-4:]}


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


def fmt_epochs(r):
    if "error" in r:
        return "ERROR: " + r["error"]
    out = []
    for ep in sorted(r["epochs"]):
        e = r["epochs"][ep]
        s = max(e["t1"] - e["t0"], 1e-9)
        out.append("e%d %.0f smp/s %.1f MB/s" % (ep, e["samples"] / s, e["bytes"] / s / 1e6))
    if r.get("loader_cpu"):
        out.append("loader CPU s per 100k samples (epochs 1+): " + ", ".join(
            "%s %.2f" % kv for kv in sorted(r["loader_cpu"].items())))
    return "; ".join(out)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--objects", type=int, default=100_000)
    ap.add_argument("--cells", default="raw,exact,block,raw:cache,exact:cache,block:cache")
    ap.add_argument("--shard-size", default="64MiB")
    ap.add_argument("--extra", default="", help="more serve flags for every cell, e.g. '--slots-per-rank 64'")
    ap.add_argument("--target", default=os.path.join(REPO, "target", "release"))
    ap.add_argument("--state", default=None)
    ap.add_argument("--results", default=os.path.join(BENCH, "RESULTS-shards.md"))
    args = ap.parse_args()
    bin_path = os.path.join(args.target, "ringfeed")
    lib = os.path.join(args.target, "libringfeed.so")
    sys.path.insert(0, os.path.join(REPO, "bindings", "python"))
    own_state = args.state is None
    state = args.state or tempfile.mkdtemp(prefix="rfshards-")
    started, procs, rows = [], [], []
    t_begin = time.time()
    try:
        ngx_pid, ngx_env = rb.start_server("nginx", state)
        started.append("nginx")
        ngx_port = int(ngx_env["RINGFEED_TEST_NGINX_URL"].rstrip("/").rsplit(":", 1)[1])
        proxy, proxy_port = rb.start_proxy(args.target, "127.0.0.1:%d" % ngx_port, state, "nginx")
        procs.append(proxy)
        root = ngx_env["RINGFEED_TEST_NGINX_ROOT"]
        raw = make_raw(root, args.objects)
        packed = os.path.join(root, "packed4k")
        shutil.rmtree(packed, ignore_errors=True)
        pack(bin_path, raw, packed, args.shard_size)
        meter = rb.CpuMeter({"server": lambda: [ngx_pid] + rb.children(ngx_pid), "proxy": lambda: [proxy.pid]})
        base = "http://127.0.0.1:%d/" % proxy_port
        for cell in [c for c in args.cells.split(",") if c]:
            kind, _, cache = cell.partition(":")
            url = base + ("raw4k/" if kind == "raw" else "packed4k/")
            extra = (["--shuffle", "block"] if kind == "block" else []) + args.extra.split()
            cache_dir = None
            if cache:
                cache_dir = tempfile.mkdtemp(prefix="cache-", dir=state)
                extra += ["--cache-dir", cache_dir]
            else:
                extra += ["--cache", "off"]
            load = os.getloadavg()[0]
            before = meter.snap()
            t0 = time.time()
            try:
                r = run_cell(bin_path, url, extra, dict(os.environ), lib)
            except Exception as e:  # a failed cell is reported; the run goes on
                r = {"error": "%s: %s" % (type(e).__name__, str(e)[:300])}
            wall = time.time() - t0
            cpu = rb.CpuMeter.cores(before, meter.snap(), wall)
            r.update({"cell": cell, "cpu": cpu, "load": load, "wall": wall})
            rows.append(r)
            rb.log("%-12s %s | nginx %.2f cores, proxy %.2f cores, load %.1f, %.0f s"
                   % (cell, fmt_epochs(r), cpu["server"], cpu["proxy"], load, wall))
            if cache_dir:
                shutil.rmtree(cache_dir, ignore_errors=True)
    finally:
        for p in procs:
            if p.poll() is None:
                p.terminate()
                p.wait(timeout=10)
        for name in started:
            subprocess.run([rb.SERVERS_SH, "stop", name, state], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        if own_state:
            shutil.rmtree(state, ignore_errors=True)
    with open(args.results, "a") as f:
        f.write("\n## %s: %d objects of %d bytes, 20 ms path, batch %d, %d epochs (%.0f s)\n\n"
                % (time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), args.objects, OBJ_BYTES, BATCH, EPOCHS,
                   time.time() - t_begin))
        f.write("| cell | per epoch | nginx cores | proxy cores | load |\n|---|---|---|---|---|\n")
        for r in rows:
            f.write("| %s | %s | %.2f | %.2f | %.1f |\n" % (r["cell"], fmt_epochs(r), r["cpu"]["server"],
                                                         r["cpu"]["proxy"], r["load"]))
        f.write("\nCommands:\n\n```\n%s\n```\n" % "\n".join(rb.COMMANDS))
    print("results appended to %s" % args.results)


if __name__ == "__main__":
    main()
