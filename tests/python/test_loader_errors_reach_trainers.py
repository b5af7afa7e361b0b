"""A loader's failure reaches every trainer in the loader's own words (issue
24): a run stopped by a vanished file, a loader that failed before any trainer
attached, one that already served its run, and a dead loader's segment. Each
Python and C trainer gets the message within about a second, not after its
whole attach timeout."""

import subprocess
import time
import uuid

import pytest

import ringfeed
from e2e_util import compile_c, kill_survivors, ringfeed_bin, wait_all


@pytest.fixture(scope="module")
def c_consumer(tmp_path_factory):
    return compile_c("dump_hashes.c", tmp_path_factory.mktemp("cbin"))


def small_dataset(root, files=64, size=100):
    root.mkdir()
    for i in range(files):
        (root / ("f%02d" % i)).write_bytes(bytes([i]) * size)
    return root


def c_attach(c_consumer, name):
    """Runs the C trainer against `name`; returns (seconds, rc, stderr)."""
    start = time.monotonic()
    proc = subprocess.run([c_consumer, name, "0"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, timeout=60)
    return time.monotonic() - start, proc.returncode, proc.stderr.decode()


def test_a_vanished_file_stops_the_run_and_both_trainers_report_the_loaders_own_error(tmp_path, c_consumer):
    root = small_dataset(tmp_path / "data")
    name = "errs-vanish-" + uuid.uuid4().hex[:8]
    loader = subprocess.Popen(
        [ringfeed_bin(), "serve", "--source", str(root), "--name", name, "--batch-size", "2", "--world-size", "2",
         "--epochs", "100000", "--slots-per-rank", "1"],
        stderr=subprocess.PIPE,
    )
    c_rank = subprocess.Popen([c_consumer, name, "1"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        with ringfeed.attach(name, 0, timeout=30) as feed:
            feed.next(timeout=30).release()
            (root / "f17").unlink()
            with pytest.raises(ringfeed.AbortedError) as e:
                while True:
                    feed.next(timeout=30).release()
            stopped_at = time.monotonic()
        (rc, _, cerr), = wait_all([c_rank], 10)
        c_seen_within = time.monotonic() - stopped_at
        loader.communicate(timeout=30)
    finally:
        kill_survivors([loader, c_rank])
    assert str(root / "f17") in str(e.value), str(e.value)
    assert "see its log" not in str(e.value)
    assert rc != 0 and str(root / "f17") in cerr.decode(), cerr.decode()
    assert c_seen_within < 2.0, c_seen_within


def test_a_loader_that_failed_before_any_trainer_attached_is_reported_at_once(tmp_path, c_consumer):
    name = "errs-early-" + uuid.uuid4().hex[:8]
    missing = tmp_path / "no-such-dir"
    proc = subprocess.run(
        [ringfeed_bin(), "serve", "--source", str(missing), "--name", name, "--batch-size", "2"],
        stderr=subprocess.PIPE, timeout=60,
    )
    assert proc.returncode != 0
    start = time.monotonic()
    with pytest.raises(ringfeed.LoaderGoneError) as e:
        ringfeed.attach(name, 0, timeout=30)
    took = time.monotonic() - start
    assert took < 2.0, took
    assert str(missing) in str(e.value) and "stopped" in str(e.value), str(e.value)
    took, rc, err = c_attach(c_consumer, name)
    assert rc != 0 and str(missing) in err, err
    assert took < 2.0, took


def test_a_loader_that_served_its_run_is_reported_at_once_and_a_new_one_clears_it(tmp_path, c_consumer):
    root = small_dataset(tmp_path / "data", files=8)
    name = "errs-ended-" + uuid.uuid4().hex[:8]
    args = [ringfeed_bin(), "serve", "--source", str(root), "--name", name, "--batch-size", "2"]
    loader = subprocess.Popen(args, stderr=subprocess.DEVNULL)
    try:
        with ringfeed.attach(name, 0, timeout=30) as feed:
            assert sum(len(b) for b in feed) == 8
        assert loader.wait(timeout=30) == 0
        start = time.monotonic()
        with pytest.raises(ringfeed.LoaderGoneError, match="served its whole run"):
            ringfeed.attach(name, 0, timeout=30)
        assert time.monotonic() - start < 2.0
        took, rc, err = c_attach(c_consumer, name)
        assert rc != 0 and "served its whole run" in err and took < 2.0, (took, err)
        # A new loader of the name starts afresh: its trainers wait for it.
        loader = subprocess.Popen(args, stderr=subprocess.DEVNULL)
        with ringfeed.attach(name, 0, timeout=30) as feed:
            assert sum(len(b) for b in feed) == 8
        assert loader.wait(timeout=30) == 0
    finally:
        kill_survivors([loader])


def test_a_dead_loaders_segment_is_reported_within_a_second_naming_gc(tmp_path, c_consumer):
    root = small_dataset(tmp_path / "data")
    name = "errs-dead-" + uuid.uuid4().hex[:8]
    loader = subprocess.Popen(
        [ringfeed_bin(), "serve", "--source", str(root), "--name", name, "--batch-size", "2", "--epochs", "1000"],
        stderr=subprocess.DEVNULL,
    )
    try:
        with ringfeed.attach(name, 0, timeout=30) as feed:
            feed.next(timeout=30).release()
        loader.kill()
        loader.wait(timeout=10)
        start = time.monotonic()
        with pytest.raises(ringfeed.LoaderGoneError, match="ringfeed gc"):
            ringfeed.attach(name, 0, timeout=30)
        assert time.monotonic() - start < 2.0
        took, rc, err = c_attach(c_consumer, name)
        assert rc != 0 and "is gone" in err and "ringfeed gc" in err and took < 2.0, (took, err)
    finally:
        kill_survivors([loader])
        subprocess.run([ringfeed_bin(), "gc"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def test_an_empty_stale_segment_is_reported_at_once_naming_gc(c_consumer):
    # What a loader that died between creating its segment and sizing it
    # leaves: an empty /dev/shm/ringfeed-NAME that no loader holds.
    name = "errs-empty-" + uuid.uuid4().hex[:8]
    path = "/dev/shm/ringfeed-" + name
    with open(path, "wb"):
        pass
    try:
        start = time.monotonic()
        with pytest.raises(ringfeed.CorruptSegmentError, match="ringfeed gc"):
            ringfeed.attach(name, 0, timeout=30)
        assert time.monotonic() - start < 2.0
        took, rc, err = c_attach(c_consumer, name)
        assert rc != 0 and "ringfeed gc" in err and took < 2.0, (took, err)
    finally:
        subprocess.run([ringfeed_bin(), "gc"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
