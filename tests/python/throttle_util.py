"""Several loaders against one throttling or stalling store: the harness of
tests/python/test_remote_throttle.py and bench/throttle_bench.py.

The store is nginx (WebDAV) behind tests/faultproxy: `--rate R` answers
every request past a token bucket of R/s `503 SlowDown` after one round
trip (as S3 throttles a prefix), `--stall F --stall-ms T` holds a fraction
of the responses T ms before their body. Each loader is `ringfeed serve`
over the same http:// prefix (no disk data cache, no manifest cache: every
object is fetched) with one Python rank that reads every sample and prints
"epoch step index len crc32" (tests/python/procs/hash_consumer.py).
"""

import json
import os
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
import zlib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RUN_TIMEOUT_S = 300
STATUS_POLL_S = 0.02


def seed_objects(root, prefix, count, size, seed_value=1):
    """`count` files of `size` random bytes under root/prefix; {index: crc32}
    in the listing's order (names sort as their index)."""
    import random

    rng = random.Random(seed_value)
    d = Path(root) / prefix
    d.mkdir(parents=True, exist_ok=True)
    crcs = {}
    for i in range(count):
        data = rng.randbytes(size)
        (d / ("%06d.bin" % i)).write_bytes(data)
        crcs[i] = (size, zlib.crc32(data))
    return crcs


class Proxy:
    """tests/faultproxy in front of `upstream` (HOST:PORT) with `flags`,
    its counters polled every STATUS_POLL_S to time the first and last
    request it saw."""

    def __init__(self, faultproxy, upstream, flags, work_dir):
        port_file = Path(work_dir) / ("faultproxy-%s.port" % os.urandom(3).hex())
        self.proc = subprocess.Popen([faultproxy, "--upstream", upstream, "--status-listen", "127.0.0.1:0",
                                      "--port-file", str(port_file)] + list(flags),
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        deadline = time.monotonic() + 20
        while not (port_file.exists() and len(port_file.read_text().split()) == 2):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError("faultproxy did not start: %s" % self.output)
            time.sleep(0.02)
        self.port, self.status_port = (int(x) for x in port_file.read_text().split())
        self.output = ""
        self.first_request = self.last_request = None
        self._seen = 0
        self._polling = True
        self._poller = threading.Thread(target=self._poll, daemon=True)
        self._poller.start()

    def counters(self):
        with urllib.request.urlopen("http://127.0.0.1:%d/" % self.status_port, timeout=10) as r:
            return json.loads(r.read())

    def _poll(self):
        while self._polling:
            try:
                n = self.counters()["requests"]
            except OSError:
                n = self._seen
            now = time.monotonic()
            if n > self._seen:
                if self.first_request is None:
                    self.first_request = now
                self.last_request = now
                self._seen = n
            time.sleep(STATUS_POLL_S)

    def stop(self):
        self._polling = False
        if self.proc.poll() is None:
            self.proc.terminate()
        try:
            self.output, _ = self.proc.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            self.output = "(faultproxy did not stop on SIGTERM)"
        return self.output


def consumer_env(lib):
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT / "bindings" / "python") + os.pathsep + env.get("PYTHONPATH", "")
    if lib:
        env["RINGFEED_LIB"] = str(lib)
    return env


def run_loaders(ringfeed, lib, source, loaders, batch=48, extra=(), metrics=False):
    """Starts `loaders` loaders of `source` at once, each with one Python
    rank, and waits for all. Returns a dict: secs (start to the last exit),
    and per loader: rc, log, rows [(epoch, step, index, len, crc)],
    first_batch_s and done_s (from the start), and its last /metrics
    scrape when `metrics` (a text, read just before it ended)."""
    procs = []
    files = []
    started = time.monotonic()
    ports = []
    for i in range(loaders):
        name = "thr-%d-%s" % (i, os.urandom(4).hex())
        log, out, err = (tempfile.TemporaryFile() for _ in range(3))
        files += [log, out, err]
        cmd = [str(ringfeed), "serve", "--source", source, "--name", name, "--batch-size", str(batch),
               "--world-size", "1", "--epochs", "1", "--seed", str(11 + i), "--manifest-cache", "off",
               "--cache", "off"] + list(extra)
        if metrics:
            port = free_port()
            ports.append(port)
            cmd += ["--metrics", "127.0.0.1:%d" % port]
        loader = subprocess.Popen(cmd, stderr=log, env=dict(os.environ, RINGFEED_LOG=os.environ.get("RINGFEED_LOG", "info")))
        rank = subprocess.Popen([sys.executable, "-u", str(ROOT / "tests" / "python" / "procs" / "stamp_consumer.py"),
                                 name], stdout=out, stderr=err, env=consumer_env(lib))
        procs.append((loader, rank, log, out, err))
    scrapes = [None] * loaders
    try:
        deadline = started + RUN_TIMEOUT_S
        while time.monotonic() < deadline:
            if all(p[0].poll() is not None and p[1].poll() is not None for p in procs):
                break
            if metrics:
                for i, port in enumerate(ports):
                    if procs[i][0].poll() is None:
                        try:
                            with urllib.request.urlopen("http://127.0.0.1:%d/metrics" % port, timeout=2) as r:
                                scrapes[i] = r.read().decode()
                        except OSError:
                            pass
            time.sleep(0.05)
    finally:
        for loader, rank, *_ in procs:
            for p in (loader, rank):
                if p.poll() is None:
                    p.kill()
                    p.wait()
    result = {"secs": time.monotonic() - started, "loaders": []}
    for i, (loader, rank, log, out, err) in enumerate(procs):
        def text(f):
            f.seek(0)
            return f.read().decode("utf-8", "replace")

        rows, first, last = [], None, None
        for line in text(out).splitlines():
            parts = line.split()
            if parts[0] == "t":
                first = float(parts[1]) if first is None else first
                last = float(parts[1])
                continue
            rows.append(tuple(int(x) for x in parts))
        result["loaders"].append({
            "rc": loader.returncode, "rank_rc": rank.returncode, "log": text(log), "rank_err": text(err),
            "rows": rows, "scrape": scrapes[i],
            "first_batch_s": None if first is None else first - wall_of(started),
            "done_s": None if last is None else last - wall_of(started),
        })
    for f in files:
        f.close()
    return result


def wall_of(monotonic_t):
    """The wall-clock time of a monotonic instant (the rank stamps wall time)."""
    return time.time() - (time.monotonic() - monotonic_t)


def check_exactly_once(result, crcs):
    """Every loader ended well and its rank read every object exactly once,
    with its bytes. Returns a list of what is wrong (empty: all well)."""
    wrong = []
    for i, l in enumerate(result["loaders"]):
        if l["rc"] != 0 or l["rank_rc"] != 0:
            wrong.append("loader %d exited %s, its rank %s: %s %s" % (i, l["rc"], l["rank_rc"], l["log"][-2000:],
                                                                    l["rank_err"][-2000:]))
            continue
        seen = {}
        for epoch, step, index, length, crc in l["rows"]:
            seen[index] = seen.get(index, 0) + 1
            if crcs.get(index) != (length, crc):
                wrong.append("loader %d: sample %d has other bytes than its file" % (i, index))
        if sorted(seen) != sorted(crcs) or any(n != 1 for n in seen.values()):
            twice = sum(1 for n in seen.values() if n > 1)
            wrong.append("loader %d: %d distinct samples of %d, %d more than once" % (i, len(seen), len(crcs), twice))
    return wrong


def scraped(text, name):
    """The value of an unlabelled sample `name` in a Prometheus text page."""
    for line in (text or "").splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    return None


def free_port():
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
