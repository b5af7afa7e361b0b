"""Every way attach and next fail raises its own ringfeed error, with a message
that says what happened."""

import os
import re
import signal
import threading
import time

import pytest

ringfeed = pytest.importorskip("ringfeed")


def test_attach_to_a_name_that_never_appears_times_out_naming_it(unused_name):
    start = time.monotonic()
    with pytest.raises(ringfeed.TimeoutError) as e:
        ringfeed.attach(unused_name, 0, timeout=0.3)
    waited = time.monotonic() - start
    assert 0.25 <= waited < 3.0
    assert unused_name in str(e.value)
    assert isinstance(e.value, TimeoutError)  # the builtin one too
    # attach waits in slices (for Ctrl-C); the message gives the whole wait.
    reported_ms = int(re.search(r"within (\d+) ms", str(e.value)).group(1))
    assert 250 <= reported_ms <= waited * 1000 + 50


def test_an_attach_still_waiting_logs_why_then_again_later(unused_name, monkeypatch, caplog):
    # A trainer stuck at attach is otherwise silent for its whole timeout.
    from ringfeed import _feed

    monkeypatch.setattr(_feed, "_ATTACH_NOTE_AFTER_S", 0.3)
    monkeypatch.setattr(_feed, "_ATTACH_NOTE_EVERY_S", 0.8)
    with caplog.at_level("WARNING", logger="ringfeed"):
        with pytest.raises(ringfeed.TimeoutError):
            ringfeed.attach(unused_name, 3, timeout=1.5)
    notes = [r.getMessage() for r in caplog.records if r.name == "ringfeed"]
    assert len(notes) == 2, notes  # after 0.3 s and 1.1 s, none at 1.5 s (the error says it)
    # The library's words, over the whole wait, with the loaders that do run
    # here (closest first) or none.
    assert re.fullmatch(
        r"ringfeed: rank 3 has waited 0\.\d s to attach to loader %r \(giving up in 1\.\d s\): no loader named \"%s\" appeared "
        r"within [2-9]\d\d ms \(looked for /dev/shm/ringfeed-%s\); (no loader that this user may attach to is running on this "
        r"machine|loaders running here, closest first: .+); start one with `ringfeed serve --name %s \.\.\.` .*, or check RINGFEED_NAME"
        % (unused_name, unused_name, unused_name, unused_name),
        notes[0],
    ), notes[0]


def test_an_attach_waiting_on_a_killed_loaders_segment_logs_that_it_is_gone(producer, monkeypatch, caplog):
    from ringfeed import _feed

    monkeypatch.setattr(_feed, "_ATTACH_NOTE_AFTER_S", 0.2)
    p = producer(world_size=1)
    p.kill()
    with caplog.at_level("WARNING", logger="ringfeed"):
        with pytest.raises(ringfeed.LoaderGoneError):
            ringfeed.attach(p.name, 0, timeout=0.6)
    notes = [r.getMessage() for r in caplog.records if r.name == "ringfeed"]
    assert len(notes) == 1, notes
    assert 'the loader of "%s" (pid %d) is gone; restart `ringfeed serve`' % (p.name, p.proc.pid) in notes[0], notes[0]


def test_ctrl_c_interrupts_an_attach_waiting_for_its_loader(unused_name):
    timer = threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGINT))
    timer.start()
    start = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        ringfeed.attach(unused_name, 0, timeout=None)
    assert time.monotonic() - start < 1.5
    timer.join()


@pytest.mark.parametrize("name", ["bad/name", "", ".hidden", "x" * 65, "sp ace", "nul\0byte", "caf\u00e9"])
def test_attach_with_an_invalid_name_raises_invalid_argument(name):
    with pytest.raises(ringfeed.InvalidArgumentError):
        ringfeed.attach(name, 0, timeout=0)


def test_attach_without_a_name_needs_ringfeed_name(monkeypatch):
    monkeypatch.delenv("RINGFEED_NAME", raising=False)
    with pytest.raises(ringfeed.InvalidArgumentError, match="RINGFEED_NAME"):
        ringfeed.attach(timeout=0)


def test_attach_with_a_negative_rank_raises_rank_error(unused_name):
    with pytest.raises(ringfeed.RankError):
        ringfeed.attach(unused_name, -1, timeout=0)


def test_attach_with_a_rank_from_a_bad_environment_raises_rank_error(monkeypatch, unused_name):
    monkeypatch.setenv("LOCAL_RANK", "zero")
    with pytest.raises(ringfeed.RankError, match="LOCAL_RANK"):
        ringfeed.attach(unused_name, timeout=0)


def test_attach_with_a_negative_rank_from_the_environment_names_the_variable(monkeypatch, unused_name):
    monkeypatch.setenv("LOCAL_RANK", "-1")
    with pytest.raises(ringfeed.RankError, match="LOCAL_RANK=-1 is negative"):
        ringfeed.attach(unused_name, timeout=0)


@pytest.mark.parametrize("timeout", [-1, float("nan"), "soon"])
def test_attach_with_a_bad_timeout_raises_invalid_argument(timeout, unused_name):
    with pytest.raises(ringfeed.InvalidArgumentError):
        ringfeed.attach(unused_name, 0, timeout=timeout)


def test_attach_to_a_rank_beyond_the_world_size_raises_rank_error(producer):
    p = producer(world_size=2)
    with pytest.raises(ringfeed.RankError, match="out of range"):
        ringfeed.attach(p.name, 2, timeout=2)


def test_a_rank_another_process_holds_raises_rank_busy_naming_it_after_the_timeout(producer):
    import subprocess
    import sys

    p = producer(world_size=1)
    holder = subprocess.Popen(
        [sys.executable, "-c", "import ringfeed, sys; f = ringfeed.attach(sys.argv[1], 0, timeout=5); print('held', flush=True); sys.stdin.read()", p.name],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        start = time.monotonic()
        with pytest.raises(ringfeed.RankBusyError, match="already has a consumer attached \\(pid %d\\)" % holder.pid):
            ringfeed.attach(p.name, 0, timeout=0.3)
        assert time.monotonic() - start >= 0.25  # it waited for the rank to be freed
    finally:
        holder.kill()
        holder.wait()
    # Once the holder is gone, the rank is free again.
    with ringfeed.attach(p.name, 0, timeout=5) as feed:
        assert feed.rank == 0


def test_a_rank_this_process_holds_raises_rank_busy_at_once_saying_what_holds_it(producer):
    # Waiting would wait on itself: a Feed of this process, still open, or
    # batches of a closed one, still alive.
    p = producer(world_size=1, batches=4, batch_size=2, sample_bytes=32, slots_per_rank=2)
    feed = ringfeed.attach(p.name, 0, timeout=5)
    start = time.monotonic()
    with pytest.raises(ringfeed.RankBusyError, match="already attached by this process .*a Feed of it is still open"):
        ringfeed.attach(p.name, 0, timeout=30)
    batch = feed.next(timeout=5)
    feed.close()
    with pytest.raises(ringfeed.RankBusyError, match="closed or dropped, but 1 batch\\(es\\) of it are not given back"):
        ringfeed.attach(p.name, 0, timeout=None)
    assert time.monotonic() - start < 5
    del batch
    with ringfeed.attach(p.name, 0, timeout=5) as again:
        assert [b.step for b in again] == [1, 2, 3]


def test_a_rank_this_process_holds_through_the_c_library_alone_is_refused_at_once(producer):
    # Held by a bare rf_attach (a C extension in the same process), which the
    # binding's own bookkeeping does not know: no retry loop until the timeout.
    import ctypes

    from ringfeed._lib import LIB

    p = producer(world_size=1)
    ptr = ctypes.c_void_p()
    assert LIB.rf_attach(p.name.encode(), 0, 5000, ctypes.byref(ptr)) == 0
    try:
        start = time.monotonic()
        with pytest.raises(ringfeed.RankBusyError, match="already attached by this process"):
            ringfeed.attach(p.name, 0, timeout=10)
        assert time.monotonic() - start < 2
    finally:
        LIB.rf_detach(ptr.value)
    with ringfeed.attach(p.name, 0, timeout=5) as feed:
        assert feed.rank == 0


def test_a_feed_in_a_reference_cycle_does_not_block_the_next_attach(producer):
    import gc

    p = producer(world_size=1, batches=2, batch_size=2, sample_bytes=32, slots_per_rank=2)
    gc.disable()
    try:
        holder = {"feed": ringfeed.attach(p.name, 0, timeout=5)}
        holder["self"] = holder  # only the cycle collector frees it
        del holder
        with ringfeed.attach(p.name, 0, timeout=5) as feed:
            assert [b.step for b in feed] == [0, 1]
    finally:
        gc.enable()


@pytest.mark.parametrize("where", ["before the _Handle", "inside the _Handle, after its finalizer"])
def test_ctrl_c_as_attach_returns_leaves_the_rank_free(producer, monkeypatch, where):
    import ringfeed._handle as handle_module

    p = producer(world_size=1, batches=2, batch_size=2, sample_bytes=32, slots_per_rank=2)
    real = handle_module.Handle

    class Interrupted(real):
        __slots__ = ()

        def __init__(self, *args):
            if where != "before the _Handle":
                super().__init__(*args)
            raise KeyboardInterrupt

    monkeypatch.setattr(handle_module, "Handle", Interrupted)
    with pytest.raises(KeyboardInterrupt):
        ringfeed.attach(p.name, 0, timeout=5)
    monkeypatch.setattr(handle_module, "Handle", real)
    import gc

    gc.collect()  # a half-made handle dies; its finalizer must not detach twice
    with ringfeed.attach(p.name, 0, timeout=2) as feed:
        assert [b.step for b in feed] == [0, 1]


def test_attach_waits_for_a_loader_restarted_in_place_of_a_dead_one(producer):
    import subprocess

    p = producer(world_size=1, batches=2, batch_size=2, sample_bytes=32, slots_per_rank=2)
    p.kill()  # its segment stays, with no loader behind it
    with pytest.raises(ringfeed.LoaderGoneError, match="pid %d.*is gone" % p.proc.pid):
        ringfeed.attach(p.name, 0, timeout=0.3)
    restarted = []
    timer = threading.Timer(0.5, lambda: restarted.append(subprocess.Popen(p.proc.args, stdout=subprocess.DEVNULL)))
    timer.start()
    try:
        start = time.monotonic()
        with ringfeed.attach(p.name, 0, timeout=20) as feed:
            assert time.monotonic() - start >= 0.4
            assert [b.step for b in feed] == [0, 1]
    finally:
        timer.join()
        for proc in restarted:
            assert proc.wait(timeout=10) == 0


def test_name_and_rank_default_to_ringfeed_name_and_local_rank(producer, monkeypatch):
    p = producer(world_size=2)
    monkeypatch.setenv("RINGFEED_NAME", p.name)
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setenv("RANK", "0")
    with ringfeed.attach(timeout=5) as feed:
        assert (feed.name, feed.rank, feed.info.rank) == (p.name, 1, 1)
    monkeypatch.delenv("LOCAL_RANK")
    monkeypatch.setenv("RANK", "1")
    with ringfeed.attach(timeout=5) as feed:
        assert feed.rank == 1
    monkeypatch.delenv("RANK")
    with ringfeed.attach(timeout=5) as feed:
        assert feed.rank == 0


@pytest.mark.parametrize("timeout", [None, 0], ids=["waiting", "polling with no timeout"])
def test_a_killed_loader_makes_next_raise_loader_gone_within_a_second(producer, timeout):
    p = producer(world_size=1, batches=100, slots_per_rank=2)
    feed = ringfeed.attach(p.name, 0, timeout=5)
    feed.next(timeout=5).release()
    p.kill()
    killed = time.monotonic()
    delivered_after_kill = 0
    with pytest.raises(ringfeed.LoaderGoneError, match="gone") as e:
        while time.monotonic() - killed < 3.0:
            try:
                # Batches published before the kill are still delivered.
                feed.next(timeout=timeout).release()
                delivered_after_kill += 1
            except ringfeed.TimeoutError:
                pass  # a poll that found nothing yet
    assert time.monotonic() - killed < 1.5
    assert delivered_after_kill <= 2
    assert p.name in str(e.value) and "pid %d" % p.proc.pid in str(e.value)
    feed.close()


def test_next_on_a_closed_feed_raises(producer):
    p = producer()
    feed = ringfeed.attach(p.name, 0, timeout=5)
    feed.close()
    feed.close()  # a second close does nothing
    assert feed.closed
    with pytest.raises(ValueError, match="closed"):
        feed.next(timeout=0)


def test_next_with_a_bad_timeout_raises_invalid_argument(producer):
    p = producer()
    with ringfeed.attach(p.name, 0, timeout=5) as feed:
        with pytest.raises(ringfeed.InvalidArgumentError):
            feed.next(timeout=-0.5)


def test_attaching_by_default_outside_torchrun_to_a_loader_of_several_ranks_warns(producer, monkeypatch, caplog):
    # `python train.py` instead of torchrun: the process trains on rank 0's
    # share alone and the loader waits for the others; nothing else says so.
    for var in ("LOCAL_RANK", "RANK", "LOCAL_WORLD_SIZE", "WORLD_SIZE"):
        monkeypatch.delenv(var, raising=False)
    p = producer(world_size=2)
    with caplog.at_level("WARNING", logger="ringfeed"):
        ringfeed.attach(p.name, timeout=10).close()
    notes = [r.getMessage() for r in caplog.records if r.name == "ringfeed"]
    assert len(notes) == 1 and "serves 2 ranks, with no torchrun environment" in notes[0], notes
    assert "torchrun --nproc-per-node 2, or the loader with --world-size 1" in notes[0], notes[0]
    caplog.clear()
    with caplog.at_level("WARNING", logger="ringfeed"):
        ringfeed.attach(p.name, 0, timeout=10).close()  # rank 0 of the caller's own choosing
        monkeypatch.setenv("LOCAL_RANK", "1")
        ringfeed.attach(p.name, timeout=10).close()
    assert [r.getMessage() for r in caplog.records if r.name == "ringfeed"] == []
