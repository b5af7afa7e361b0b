"""`serve --idle-timeout` (issue 39, item 4): a loader that no trainer has been
attached to for that long (none came since it started, or none since the last
one left) stops, exits 4 (docs/operations.md), says why, and leaves that word
for trainers that attach later. A trainer attached, however slow, keeps it
running. Before, a loader with no trainer waited for ever."""
import os
import subprocess
import time
import uuid

import pytest

from e2e_util import kill_survivors, ringfeed_bin

ringfeed = pytest.importorskip("ringfeed")

EXIT_IDLE = 4


@pytest.fixture
def data(tmp_path):
    d = tmp_path / "data"
    d.mkdir()
    for i in range(32):
        (d / ("f%02d" % i)).write_bytes(os.urandom(64 + i))
    return d


def _serve(data, name, *flags):
    p = subprocess.Popen(
        [ringfeed_bin(), "serve", "--source", str(data), "--name", name, "--batch-size", "2", "--world-size", "1",
         "--epochs", "3", "--manifest-cache", "off", *flags],
        stderr=subprocess.PIPE, text=True,
    )
    return p


def _wait_serving(p):
    lines = []
    for line in p.stderr:
        lines.append(line)
        if line.startswith("ringfeed: serving"):
            return lines
    raise AssertionError("the loader did not start (exit %s):\n%s" % (p.wait(), "".join(lines)))


def test_a_loader_no_trainer_attaches_to_stops_after_its_idle_timeout(data):
    name = "idle-none-%s" % uuid.uuid4().hex[:8]
    start = time.monotonic()
    p = _serve(data, name, "--idle-timeout", "2s")
    try:
        _, err = p.communicate(timeout=30)
    finally:
        kill_survivors([p])
    took = time.monotonic() - start
    assert p.returncode == EXIT_IDLE, err
    assert 2.0 <= took < 6.0, "stopped after %.1f s:\n%s" % (took, err)
    assert "ringfeed: stopped: no trainer attached in the 2s since the loader started (--idle-timeout 2s)" in err, err
    assert "error" not in err.lower(), err
    assert not os.path.exists("/dev/shm/ringfeed-" + name)
    # A trainer that comes later is told at once why there is no loader.
    t = time.monotonic()
    with pytest.raises(ringfeed.LoaderGoneError) as e:
        ringfeed.attach(name, 0, timeout=10)
    assert time.monotonic() - t < 3
    assert "--idle-timeout 2s" in str(e.value) and "no trainer attached" in str(e.value), str(e.value)


def test_a_loader_stops_once_no_trainer_came_back_for_its_idle_timeout(data):
    name = "idle-left-%s" % uuid.uuid4().hex[:8]
    p = _serve(data, name, "--idle-timeout", "2s")
    try:
        _wait_serving(p)
        feed = ringfeed.attach(name, 0, timeout=10)
        # Attached for longer than the limit, taking little: not idle.
        for _ in range(3):
            feed.next(timeout=10).release()
            time.sleep(1.2)
        assert p.poll() is None, "the loader stopped with a trainer attached"
        feed.close()
        left = time.monotonic()
        _, err = p.communicate(timeout=30)
        took = time.monotonic() - left
    finally:
        kill_survivors([p])
    assert p.returncode == EXIT_IDLE, err
    assert 2.0 <= took < 6.0, "stopped %.1f s after the trainer left:\n%s" % (took, err)
    assert "no trainer has been attached for 2s, since the last one left (--idle-timeout 2s)" in err, err


def test_idle_timeout_off_waits_for_trainers(data):
    name = "idle-off-%s" % uuid.uuid4().hex[:8]
    p = _serve(data, name, "--idle-timeout", "off")
    try:
        _wait_serving(p)
        time.sleep(3)
        assert p.poll() is None
        with ringfeed.attach(name, 0, timeout=10) as feed:
            for batch in feed:
                batch.release()
        _, err = p.communicate(timeout=30)
        assert p.returncode == 0, err
    finally:
        kill_survivors([p])


def test_a_bad_idle_timeout_is_refused_naming_the_flag(data):
    p = _serve(data, "idle-bad", "--idle-timeout", "soon")
    _, err = p.communicate(timeout=30)
    assert p.returncode == 2, err
    assert "--idle-timeout \"soon\"" in err and "off or 0" in err, err
