"""Fixtures for the Python binding's tests, run against a real loader process.

Which ringfeed is tested:
- by default the package in bindings/python (put first on sys.path), loading
  $RINGFEED_LIB, else the newest of target/{debug,release}/libringfeed.so;
- with RINGFEED_TEST_INSTALLED=1, whatever `import ringfeed` finds (an
  installed wheel with its bundled library).

The loader is the hidden subcommand of the main binary ($RINGFEED_BIN, else
target/debug/ringfeed):

    ringfeed ring-test-producer --name NAME --world-size W --batches N
        --batch-size B --sample-bytes L [--slots-per-rank K]

It creates the ring, prints "ready" on stdout, publishes N batches to each rank
(batch s of rank r: epoch 0, step s, B samples laid end to end, sample j at
offset j*L with L bytes, index (s*W + r)*B + j, byte p of it (index*7 + p) % 251),
finishes, waits until every batch is released, and exits 0. Tests that need it
are skipped, saying why, when the binary or the subcommand is missing.
"""

import os
import queue
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[2]
BINDINGS = REPO / "bindings" / "python"
READY_TIMEOUT_S = 15.0


def _pick_library():
    """$RINGFEED_LIB, else the most recently built libringfeed.so of the workspace."""
    if os.environ.get("RINGFEED_LIB"):
        return os.environ["RINGFEED_LIB"]
    built = [REPO / "target" / kind / "libringfeed.so" for kind in ("debug", "release")]
    built = [p for p in built if p.is_file()]
    if not built:
        return None
    return str(max(built, key=lambda p: p.stat().st_mtime))


# Loaders started by the tests keep their manifest cache here, not in the
# user's ~/.cache (and every test run starts with an empty one).
_CACHE_DIR = tempfile.TemporaryDirectory(prefix="ringfeed-test-cache-")
os.environ["RINGFEED_CACHE_DIR"] = _CACHE_DIR.name

if os.environ.get("RINGFEED_TEST_INSTALLED") != "1":
    sys.path.insert(0, str(BINDINGS))
    # Python subprocesses of the tests (tests/python/procs) import it too.
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(BINDINGS), os.environ.get("PYTHONPATH")]))
    _lib_path = _pick_library()
    if _lib_path:
        os.environ["RINGFEED_LIB"] = _lib_path


def pytest_report_header(config):
    where = "installed package" if os.environ.get("RINGFEED_TEST_INSTALLED") == "1" else str(BINDINGS)
    return "ringfeed: %s, RINGFEED_LIB=%s, producer=%s" % (
        where,
        os.environ.get("RINGFEED_LIB", "(bundled)"),
        _producer_bin(),
    )


def _producer_bin():
    """$RINGFEED_BIN, else target/debug/ringfeed, else target/release/ringfeed."""
    if os.environ.get("RINGFEED_BIN"):
        return os.environ["RINGFEED_BIN"]
    debug, release = (REPO / "target" / kind / "ringfeed" for kind in ("debug", "release"))
    return str(release if release.is_file() and not debug.is_file() else debug)


_probe_result = None


def _probe_producer():
    """None if the test producer is usable, else why not (computed once)."""
    global _probe_result
    if _probe_result is not None:
        return _probe_result or None
    path = _producer_bin()
    if not os.path.isfile(path):
        why = "no loader binary at %s (build it with `cargo build`, or set RINGFEED_BIN)" % path
    else:
        try:
            out = subprocess.run(
                [path, "ring-test-producer", "--help"],
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                timeout=20,
                text=True,
            )
            ok = out.returncode == 0 and "--world-size" in out.stdout
            why = "" if ok else "%s has no `ring-test-producer` subcommand yet (exit %d)" % (path, out.returncode)
        except (OSError, subprocess.TimeoutExpired) as e:
            why = "cannot run %s: %s" % (path, e)
    _probe_result = why
    return why or None


def expected_indices(step, rank, world_size, batch_size):
    """Manifest indices of batch ``step`` of ``rank`` (the test producer's rule)."""
    first = (step * world_size + rank) * batch_size
    return np.arange(first, first + batch_size, dtype=np.uint64)


def expected_sample(index, sample_bytes):
    """The bytes of sample ``index``: byte p is (index*7 + p) % 251."""
    return ((int(index) * 7 + np.arange(sample_bytes, dtype=np.int64)) % 251).astype(np.uint8)


class Producer:
    """A running `ringfeed ring-test-producer`."""

    _count = 0

    def __init__(self, world_size, batches, batch_size, sample_bytes, slots_per_rank):
        Producer._count += 1
        self.name = "pytest-%d-%d" % (os.getpid(), Producer._count)
        self.world_size = world_size
        self.batches = batches
        self.batch_size = batch_size
        self.sample_bytes = sample_bytes
        self.slots_per_rank = slots_per_rank
        cmd = [
            _producer_bin(), "ring-test-producer",
            "--name", self.name,
            "--world-size", str(world_size),
            "--batches", str(batches),
            "--batch-size", str(batch_size),
            "--sample-bytes", str(sample_bytes),
        ]
        if slots_per_rank is not None:
            cmd += ["--slots-per-rank", str(slots_per_rank)]
        self._stderr = tempfile.TemporaryFile()
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=self._stderr, text=True)
        self._lines = queue.Queue()
        threading.Thread(target=self._read_stdout, daemon=True).start()
        self._wait_ready(cmd)

    def _read_stdout(self):
        for line in self.proc.stdout:
            self._lines.put(line.strip())
        self._lines.put(None)

    def _wait_ready(self, cmd):
        deadline = time.monotonic() + READY_TIMEOUT_S
        while True:
            try:
                line = self._lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                line = None
            if line == "ready":
                return
            if line is None:
                self.kill()
                raise RuntimeError("%s did not print 'ready' (exit %s); stderr:\n%s" % (" ".join(cmd), self.proc.poll(), self.stderr()))

    def stderr(self):
        self._stderr.seek(0)
        return self._stderr.read().decode("utf-8", "replace")

    def expected_indices(self, step, rank):
        return expected_indices(step, rank, self.world_size, self.batch_size)

    def check_batch(self, batch, step, rank):
        """Asserts that ``batch`` is batch ``step`` of ``rank``, bytes included."""
        assert (batch.epoch, batch.step) == (0, step)
        assert len(batch) == self.batch_size
        indices = self.expected_indices(step, rank)
        assert batch.indices.dtype == np.uint64
        np.testing.assert_array_equal(batch.indices, indices)
        for j, index in enumerate(indices):
            got = np.frombuffer(batch.sample(j), dtype=np.uint8)
            np.testing.assert_array_equal(got, expected_sample(index, self.sample_bytes))

    def wait(self, timeout=10.0):
        """Exit code, after at most ``timeout`` seconds."""
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError("the producer did not exit within %s s; stderr:\n%s" % (timeout, self.stderr())) from None

    def kill(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()

    def cleanup(self):
        self.kill()
        # A killed loader leaves its segment; remove ours (never another's).
        segment = Path("/dev/shm/ringfeed-%s" % self.name)
        if segment.exists():
            segment.unlink()
        self._stderr.close()


@pytest.fixture
def producer():
    """Starts a test producer: producer(world_size=1, batches=4, batch_size=4,
    sample_bytes=64, slots_per_rank=2). Skips if there is none to start."""
    why = _probe_producer()
    if why:
        pytest.skip(why)
    started = []

    def start(world_size=1, batches=4, batch_size=4, sample_bytes=64, slots_per_rank=2):
        p = Producer(world_size, batches, batch_size, sample_bytes, slots_per_rank)
        started.append(p)
        return p

    yield start
    for p in started:
        p.cleanup()


@pytest.fixture
def unused_name():
    """A loader name no loader uses."""
    return "pytest-absent-%d-%d" % (os.getpid(), time.monotonic_ns())


@pytest.fixture
def sticky_shared_dir():
    """A sticky, world-writable directory under /tmp (as /tmp itself is), where
    another user may plant links and FIFOs (issue 32's tests)."""
    import shutil
    d = Path(tempfile.mkdtemp(dir="/tmp", prefix="rf-shared-"))
    os.chmod(d, 0o1777)
    yield d
    shutil.rmtree(d, ignore_errors=True)

