#!/usr/bin/env python3
"""Time to first batch and the loader's memory on a token corpus of 10 million
documents and 10 billion tokens (issue 38, item 5): prints figures, never asserts.

    cargo build --release -p ringfeed --bin ringfeed -p ringfeed-ffi -p faultproxy
    /work/venv/bin/python bench/tokens_scale.py [--docs 10000000 --tokens 10000000000]

The corpus is a Megatron-Core pair: PREFIX.bin is sparse (10^10 uint16 tokens
read as zeros: 20 GB of holes, no disk), PREFIX.idx is real (sequence lengths
around 1,000 tokens, the pointers end to end, a document per sequence: 200 MB),
written by numpy in the layout of megatron/core/datasets/indexed_dataset.py.
Each start is timed from the `ringfeed serve` launch to the first batch one
Python rank receives (--seq-len 2048, batch 8, one rank):

- local, index not in the page cache (posix_fadvise DONTNEED on the .idx first);
- local, index in the page cache;
- remote over http (nginx, tests/servers) behind tests/faultproxy adding 20 ms
  per round trip: a first start fetches the .idx into the token cache
  directory; the next starts map it from there.

The loader's memory: VmHWM (peak resident, the mapped index's pages included),
and its peak anonymous memory (RssAnon, sampled every 20 ms: what it allocated),
beside the ring's size.
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

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "bench"))
from remote_bench import SERVERS_SH, load_env, start_proxy  # noqa: E402

SEQ_LEN = 2048
BATCH = 8


def log(msg):
    print("[tokens_scale %s] %s" % (time.strftime("%H:%M:%S"), msg), file=sys.stderr, flush=True)


def make_corpus(prefix, docs, tokens):
    """PREFIX.idx of `docs` sequences adding up to `tokens`, PREFIX.bin sparse."""
    rng = np.random.default_rng(38)
    mean = tokens // docs
    lengths = rng.integers(mean // 2, mean + mean // 2, size=docs).astype(np.int64)
    lengths[-1] += tokens - int(lengths.sum())
    assert lengths[-1] > 0 and lengths.sum() == tokens
    pointers = np.zeros(docs, dtype=np.int64)
    np.cumsum(lengths[:-1] * 2, out=pointers[1:])
    with open(prefix + ".idx", "wb") as f:
        f.write(b"MMIDIDX\x00\x00")
        f.write(np.array([1], "<u8").tobytes())
        f.write(bytes([8]))  # uint16
        f.write(np.array([docs, docs + 1], "<u8").tobytes())
        f.write(lengths.astype("<i4").tobytes())
        f.write(pointers.astype("<i8").tobytes())
        f.write(np.arange(docs + 1, dtype="<i8").tobytes())
    with open(prefix + ".bin", "wb") as f:
        f.truncate(tokens * 2)


def evict(path):
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def status_kb(pid, field):
    try:
        with open("/proc/%d/status" % pid) as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def first_batch(bin_path, source, env, extra=()):
    """(seconds to the first batch, VmHWM MiB, peak RssAnon MiB, ring MiB, log)."""
    name = "tscale%d" % os.getpid()
    cmd = [bin_path, "serve", "--source", source, "--name", name, "--seq-len", str(SEQ_LEN), "--batch-size",
           str(BATCH), "--world-size", "1", *extra]
    t0 = time.time()
    serve = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True, env=env)
    lines, anon = [], [0]
    threading.Thread(target=lambda: lines.extend(l.rstrip("\n") for l in serve.stderr), daemon=True).start()
    stop = threading.Event()

    def sample():
        while not stop.is_set():
            anon[0] = max(anon[0], status_kb(serve.pid, "RssAnon"))
            time.sleep(0.02)

    threading.Thread(target=sample, daemon=True).start()
    import ringfeed

    try:
        feed = ringfeed.attach(name, 0, timeout=600)
        b = feed.next(timeout=600)
        secs = time.time() - t0
        assert b.tokens.shape == (BATCH, SEQ_LEN + 1)
        b.release()
        # A few more batches, then the loader's peak.
        for _ in range(50):
            x = feed.next(timeout=60)
            if x is None:
                break
            x.release()
        time.sleep(0.2)
        hwm = status_kb(serve.pid, "VmHWM")
        feed.close()
    finally:
        stop.set()
        serve.send_signal(signal.SIGTERM)
        try:
            serve.wait(timeout=30)
        except subprocess.TimeoutExpired:
            serve.kill()
            serve.wait()
    ring = next((l.split(" ring ")[1].split(" in ")[0] for l in lines if " ring " in l), "?")
    return secs, hwm / 1024, anon[0] / 1024, ring, lines


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--docs", type=int, default=10_000_000)
    ap.add_argument("--tokens", type=int, default=10_000_000_000)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--target", default=os.path.join(REPO, "target", "release"))
    ap.add_argument("--no-remote", action="store_true")
    args = ap.parse_args()
    os.environ.setdefault("RINGFEED_LIB", os.path.join(args.target, "libringfeed.so"))
    sys.path.insert(0, os.path.join(REPO, "bindings", "python"))
    bin_path = os.path.join(args.target, "ringfeed")
    work = tempfile.mkdtemp(prefix="tokens-scale-")
    state = os.path.join(work, "state")
    os.makedirs(state)
    env = dict(os.environ, RINGFEED_CACHE_DIR=os.path.join(work, "cache"))
    try:
        prefix = os.path.join(work, "corpus_text_document")
        t = time.time()
        make_corpus(prefix, args.docs, args.tokens)
        log("corpus: %d documents, %d tokens; .idx %.0f MB written in %.1f s" % (
            args.docs, args.tokens, os.path.getsize(prefix + ".idx") / 1e6, time.time() - t))
        rows = []
        for run in range(args.runs):
            evict(prefix + ".idx")
            rows.append(("local, index not cached",) + first_batch(bin_path, prefix, env)[:4])
            rows.append(("local, index cached",) + first_batch(bin_path, prefix, env)[:4])
        if not args.no_remote:
            subprocess.run([SERVERS_SH, "start", "nginx", state], check=True, stdout=subprocess.DEVNULL)
            ngx = load_env(os.path.join(state, "nginx.env"))
            root = ngx["RINGFEED_TEST_NGINX_ROOT"]
            for ext in (".bin", ".idx"):
                os.link(prefix + ext, os.path.join(root, "corpus_text_document" + ext))
            port = ngx["RINGFEED_TEST_NGINX_URL"].rstrip("/").rsplit(":", 1)[1]
            proxy, proxy_port = start_proxy(args.target, "127.0.0.1:" + port, state, "tokens")
            url = "http://127.0.0.1:%d/corpus_text_document" % proxy_port
            try:
                for run in range(args.runs):
                    shutil.rmtree(os.path.join(work, "cache"), ignore_errors=True)
                    rows.append(("20 ms remote, index fetched",) + first_batch(bin_path, url, env)[:4])
                    rows.append(("20 ms remote, index in the token cache",) + first_batch(bin_path, url, env)[:4])
            finally:
                proxy.terminate()
                subprocess.run([SERVERS_SH, "stop", "nginx", state], stdout=subprocess.DEVNULL)
        load = os.getloadavg()
        print("\n%d documents, %d tokens (Megatron pair, sparse .bin); --seq-len %d, batch %d, 1 rank; "
              "load average %.1f %.1f %.1f on %d cores; `python3 bench/tokens_scale.py`\n"
              % (args.docs, args.tokens, SEQ_LEN, BATCH, load[0], load[1], load[2], os.cpu_count()))
        print("| start | first batch | loader VmHWM | loader peak RssAnon | ring |")
        print("|---|---:|---:|---:|---:|")
        for what, secs, hwm, anon, ring in rows:
            print("| %s | %.2f s | %.0f MiB | %.0f MiB | %s |" % (what, secs, hwm, anon, ring))
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
