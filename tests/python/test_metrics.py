"""`ringfeed serve --metrics`: a real loader's endpoint, scraped over HTTP and
parsed with prometheus_client's standard text parser; its figures must match
what the trainers (this test, attached to both ranks) saw."""
import os
import re
import signal
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.request
import uuid

import pytest

import ringfeed
from e2e_util import kill_survivors, ringfeed_bin

parser = pytest.importorskip("prometheus_client.parser")

WORLD, BATCH, SLOTS = 2, 4, 4
FILES, FILE_BYTES = 160, 1000  # 20 batches per rank
STARTUP_TIMEOUT_S = 60
WAIT_PROBE_S = 0.3


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    root = tmp_path_factory.mktemp("metrics-data")
    for i in range(FILES):
        # Sizes differ, so the delivered bytes depend on which batches came.
        (root / ("f%03d.bin" % i)).write_bytes(bytes([i % 251]) * (FILE_BYTES + i))
    return root


class Loader:
    """A `ringfeed serve --metrics 127.0.0.1:0` whose stderr is read on a thread."""

    def __init__(self, root, name, extra=()):
        self.name = name
        self.proc = subprocess.Popen(
            [ringfeed_bin(), "serve", "--source", str(root), "--name", name, "--batch-size", str(BATCH),
             "--world-size", str(WORLD), "--slots-per-rank", str(SLOTS), "--metrics", "127.0.0.1:0"] + list(extra),
            stderr=subprocess.PIPE, text=True,
        )
        self.lines = []
        self._cond = threading.Condition()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        for line in self.proc.stderr:
            with self._cond:
                self.lines.append(line)
                self._cond.notify_all()
        with self._cond:
            self.lines.append(None)
            self._cond.notify_all()

    def wait_for(self, pattern):
        """The first match of ``pattern`` in the loader's log, waiting for it."""
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        with self._cond:
            while True:
                for line in self.lines:
                    if line is None:
                        raise AssertionError("the loader exited (%s) before logging %r:\n%s" % (self.proc.wait(), pattern, self.log()))
                    m = re.search(pattern, line)
                    if m:
                        return m
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError("no %r in the loader's log within %d s:\n%s" % (pattern, STARTUP_TIMEOUT_S, self.log()))
                self._cond.wait(left)

    def log(self):
        return "".join(l for l in list(self.lines) if l)


def scrape(url):
    """(Content-Type, {(sample name, sorted labels): value}, {family name: family})."""
    with urllib.request.urlopen(url, timeout=10) as r:
        assert r.status == 200
        ctype = r.headers["Content-Type"]
        body = r.read().decode("utf-8")
    families = {f.name: f for f in parser.text_string_to_metric_families(body)}
    samples = {}
    for f in families.values():
        for s in f.samples:
            key = (s.name, tuple(sorted(s.labels.items())))
            assert key not in samples, "sample %s twice" % (key,)
            samples[key] = s.value
    return ctype, samples, families


def value(samples, metric, /, **labels):
    key = (metric, tuple(sorted((k, str(v)) for k, v in labels.items())))
    assert key in samples, "no sample %s{%s} in the scrape" % (metric, labels)
    return samples[key]


def test_a_scrape_parses_and_matches_what_the_trainers_saw(dataset):
    name = "metrics-%s" % uuid.uuid4().hex[:8]
    loader = Loader(dataset, name)
    feeds, held = [], []
    try:
        url = loader.wait_for(r"ringfeed: metrics at (http://127\.0\.0\.1:\d+/metrics)").group(1)
        loader.wait_for(r"^ringfeed: serving")
        feeds = [ringfeed.attach(name, rank, timeout=30) for rank in range(WORLD)]
        taken, nbytes, released = [0] * WORLD, [0] * WORLD, [0] * WORLD
        in_next_s = [0.0] * WORLD  # time spent in next(), waits included

        def take(rank, timeout=30):
            t0 = time.monotonic()
            try:
                b = feeds[rank].next(timeout=timeout)
            finally:
                in_next_s[rank] += time.monotonic() - t0
            assert b is not None
            taken[rank] += 1
            nbytes[rank] += b.nbytes
            return b

        def release(rank, b):
            b.release()
            released[rank] += 1

        # Rank 0 takes 3 and still holds the last; rank 1 takes 5.
        for i in range(3):
            b = take(0)
            if i < 2:
                release(0, b)
            else:
                held.append(b)
        for _ in range(5):
            release(1, take(1))
        # Rank 1 waits for data: with the loader stopped, it takes what was
        # published and then waits WAIT_PROBE_S for a batch that cannot come.
        os.kill(loader.proc.pid, signal.SIGSTOP)
        try:
            while True:
                try:
                    b = take(1, timeout=WAIT_PROBE_S)
                except ringfeed.TimeoutError:
                    break
                release(1, b)
        finally:
            os.kill(loader.proc.pid, signal.SIGCONT)

        ctype, samples, families = scrape(url)
        assert ctype.startswith("text/plain; version=0.0.4"), ctype
        # A standard parser read every family with its declared type and help.
        for f in families.values():
            assert f.type in ("counter", "gauge", "histogram"), (f.name, f.type)
            assert f.documentation, f.name
        assert families["ringfeed_rank_batches_delivered"].type == "counter"
        assert families["ringfeed_rank_queued_batches"].type == "gauge"

        assert value(samples, "ringfeed_loader_state", state="running") == 1
        assert value(samples, "ringfeed_loader_state", state="starting") == 0
        reader = value_label(samples, "ringfeed_loader_info", "reader")
        assert reader in ("io_uring", "pread"), reader
        assert value(samples, "ringfeed_loader_info", name=name, reader=reader) == 1
        assert value(samples, "ringfeed_ring_ranks") == WORLD
        assert value(samples, "ringfeed_ring_slots_per_rank") == SLOTS
        assert value(samples, "ringfeed_job_world_size") == WORLD
        published_all = 0
        for rank in range(WORLD):
            delivered = value(samples, "ringfeed_rank_batches_delivered_total", rank=rank)
            published = value(samples, "ringfeed_rank_batches_published_total", rank=rank)
            assert delivered == taken[rank], "rank %d: %s delivered, the trainer took %d" % (rank, delivered, taken[rank])
            assert value(samples, "ringfeed_rank_delivered_bytes_total", rank=rank) == nbytes[rank]
            assert value(samples, "ringfeed_rank_batches_released_total", rank=rank) == released[rank]
            assert value(samples, "ringfeed_rank_held_batches", rank=rank) == taken[rank] - released[rank]
            assert value(samples, "ringfeed_rank_queued_batches", rank=rank) == published - delivered
            assert delivered <= published <= delivered + SLOTS
            assert value(samples, "ringfeed_rank_consumer_attached", rank=rank) == 1
            assert value(samples, "ringfeed_rank_consumer_pid", rank=rank) == os.getpid()
            assert value(samples, "ringfeed_rank_batches_expected", rank=rank) == FILES // (WORLD * BATCH)
            published_all += published
        assert value(samples, "ringfeed_batches_published_total") == published_all
        assert held and value(samples, "ringfeed_rank_held_batches", rank=0) == 1
        # Each rank's wait is counted: at most the time its next() calls
        # took, and for rank 1 at least the probe's timeout.
        for rank in range(WORLD):
            wait = value(samples, "ringfeed_rank_wait_seconds_total", rank=rank)
            assert 0 <= wait <= in_next_s[rank] + 0.01, (rank, wait, in_next_s)
        assert value(samples, "ringfeed_rank_wait_seconds_total", rank=1) >= WAIT_PROBE_S * 0.95
        assert value(samples, "ringfeed_metrics_requests_total", code="200") >= 1

        # Other paths and methods.
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(url.replace("/metrics", "/other"), timeout=10)
        assert e.value.code == 404
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(urllib.request.Request(url, data=b"x", method="POST"), timeout=10)
        assert e.value.code == 405
        _, after, _ = scrape(url)
        assert value(after, "ringfeed_metrics_requests_total", code="404") == 1
        assert value(after, "ringfeed_metrics_requests_total", code="405") == 1

        # The run goes on to its end: scraping disturbed nothing.
        for b in held:
            release(0, b)
        held.clear()
        for rank in range(WORLD):
            while feeds[rank].next(timeout=30) is not None:
                taken[rank] += 1
        assert taken == [FILES // (WORLD * BATCH)] * WORLD
        for f in feeds:
            f.close()
        assert loader.proc.wait(timeout=30) == 0, loader.log()
    finally:
        held.clear()
        for f in feeds:
            f.close()
        kill_survivors([loader.proc])


def value_label(samples, name, label):
    """The value of ``label`` on the one sample of ``name``."""
    found = [dict(labels)[label] for (n, labels) in samples if n == name]
    assert len(found) == 1, found
    return found[0]


def serve_fails(root, addr):
    p = subprocess.run(
        [ringfeed_bin(), "serve", "--source", str(root), "--name", "metrics-bad-%s" % uuid.uuid4().hex[:8],
         "--batch-size", "4", "--world-size", "1", "--metrics", addr],
        stderr=subprocess.PIPE, text=True, timeout=60,
    )
    assert p.returncode != 0, p.stderr
    # Said before the dataset is listed, not after.
    assert "ringfeed: manifest:" not in p.stderr, p.stderr
    return p.stderr


@pytest.mark.parametrize("addr, needle", [
    ("127.0.0.1:99999", "not a number from 0 to 65535"),
    ("9464", "HOST:PORT"),
    ("203.0.113.7:9464", "no such address"),
])
def test_a_bad_metrics_address_is_an_error_naming_it_and_the_fix(dataset, addr, needle):
    err = serve_fails(dataset, addr)
    assert addr in err and needle in err, err


def test_a_metrics_port_in_use_is_an_error_naming_it_and_the_fix(dataset):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(1)
        addr = "127.0.0.1:%d" % s.getsockname()[1]
        err = serve_fails(dataset, addr)
    assert addr in err and "already in use" in err and "port 0" in err, err
