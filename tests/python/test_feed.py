"""Batches arrive in order with their bytes, as zero-copy views, and a slot goes
back to the loader exactly when the last view of it dies.

The loader's side is the observer: a rank's batches take its K slots in turn,
so batch n + K cannot be published until batch n is given back. "next()
raises AllSlotsHeldError" means "the slot is still held" and "next() returns"
means "it was released".
"""

import gc
import os
import signal
import threading
import time

import numpy as np
import pytest

from conftest import expected_sample

ringfeed = pytest.importorskip("ringfeed")

HELD_PROBE_S = 0.2  # how long next() waits to show that no slot is free


def run_script(script, *args):
    """Runs `python -c SCRIPT ARGS` in a fresh interpreter that imports this
    ringfeed; returns the CompletedProcess (stdout and stderr captured)."""
    import subprocess
    import sys

    return subprocess.run([sys.executable, "-c", script] + list(args), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          timeout=30, env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path)))


def assert_slot_still_held(feed):
    with pytest.raises(ringfeed.AllSlotsHeldError, match="still holds the batch"):
        feed.next(timeout=HELD_PROBE_S)


def test_every_batch_of_every_rank_arrives_once_in_order_with_its_bytes(producer):
    p = producer(world_size=2, batches=6, batch_size=4, sample_bytes=100, slots_per_rank=2)
    feeds = [ringfeed.attach(p.name, r, timeout=5) for r in range(2)]
    for step in range(6):
        for rank, feed in enumerate(feeds):
            batch = feed.next(timeout=5)
            p.check_batch(batch, step, rank)
            batch.release()
    for feed in feeds:
        assert feed.next(timeout=5) is None
        assert feed.next(timeout=0) is None  # the end stays the end
        feed.close()
    assert p.wait() == 0


def test_iterating_a_feed_yields_every_batch_then_stops(producer):
    p = producer(world_size=1, batches=5, batch_size=3, sample_bytes=40)
    steps = []
    with ringfeed.attach(p.name, 0, timeout=5) as feed:
        for batch in feed:
            p.check_batch(batch, batch.step, 0)
            steps.append(batch.step)
            batch.release()
    assert steps == list(range(5))
    assert p.wait() == 0


def test_info_describes_the_ring(producer):
    p = producer(world_size=2, batches=3, batch_size=4, sample_bytes=64, slots_per_rank=3)
    with ringfeed.attach(p.name, 1, timeout=5) as feed:
        info = feed.info
        assert (info.world_size, info.rank, info.slots_per_rank) == (2, 1, 3)
        assert info.max_samples_per_slot >= 4
        assert info.slot_payload_bytes >= 4 * 64 and info.slot_payload_bytes % 4096 == 0
        assert info.payload_region_address % 4096 == 0
        assert info.payload_region_bytes >= 2 * 3 * info.slot_payload_bytes
        assert info.batches_expected in (None, 3)


def test_array_is_a_view_into_the_payload_region(producer):
    p = producer(world_size=1, batches=2, batch_size=4, sample_bytes=64)
    with ringfeed.attach(p.name, 0, timeout=5) as feed:
        batch = feed.next(timeout=5)
        arr = batch.array("uint16", (4, 32))
        address = arr.__array_interface__["data"][0]
        region = feed.info.payload_region_address
        assert region <= address and address + arr.nbytes <= region + feed.info.payload_region_bytes
        assert address == batch.data_ptr and address % 4096 == 0
        expected = np.concatenate([expected_sample(i, 64) for i in batch.indices])
        np.testing.assert_array_equal(arr, expected.view("<u2").reshape(4, 32))
        sample = batch.sample(2)
        assert np.frombuffer(sample, np.uint8).__array_interface__["data"][0] == address + 2 * 64
        assert bytes(batch.buffer()) == expected.tobytes()
        del arr, sample
        batch.release()


def test_array_refuses_shapes_and_dtypes_that_do_not_fit(producer):
    p = producer(world_size=1, batches=1, batch_size=4, sample_bytes=6)
    with ringfeed.attach(p.name, 0, timeout=5) as feed:
        with feed.next(timeout=5) as batch:
            assert batch.array().shape == (4, 6)
            assert batch.array("uint16").shape == (4, 3)
            assert batch.array("uint8", -1).shape == (24,)
            assert batch.array("uint16", (2, -1)).shape == (2, 6)
            with pytest.raises(ValueError, match="not a whole number"):
                batch.array("uint32")  # 6-byte samples
            with pytest.raises(ValueError, match="holds 30"):
                batch.array("uint8", (5, 6))
            with pytest.raises(ValueError, match="cannot view"):
                batch.array(object)
            with pytest.raises(IndexError):
                batch.sample(4)
            assert bytes(batch.sample(-1)) == bytes(batch.sample(3))


def test_torch_from_numpy_shares_the_ring_memory(producer):
    torch = pytest.importorskip("torch")
    p = producer(world_size=1, batches=2, batch_size=4, sample_bytes=64, slots_per_rank=1)
    with ringfeed.attach(p.name, 0, timeout=5) as feed:
        batch = feed.next(timeout=5)
        arr = batch.array("uint8", (4, 64))
        tensor = torch.from_numpy(arr)
        assert tensor.data_ptr() == arr.__array_interface__["data"][0] == batch.data_ptr
        expected = np.stack([expected_sample(i, 64) for i in batch.indices])
        del arr, batch
        gc.collect()
        # The tensor alone keeps the slot: still readable, still held.
        np.testing.assert_array_equal(tensor.numpy(), expected)
        assert_slot_still_held(feed)
        del tensor
        assert feed.next(timeout=5).step == 1


def test_release_defers_while_a_view_is_alive(producer):
    p = producer(world_size=1, batches=3, batch_size=2, sample_bytes=32, slots_per_rank=1)
    with ringfeed.attach(p.name, 0, timeout=5) as feed:
        batch = feed.next(timeout=5)
        view = batch.sample(0)
        batch.release()
        assert not batch.released and feed.held == 1
        assert_slot_still_held(feed)
        np.testing.assert_array_equal(np.frombuffer(view, np.uint8), expected_sample(batch.indices[0], 32))
        del view
        assert batch.released and feed.held == 0
        assert feed.next(timeout=5).step == 1


def test_dropping_the_batch_keeps_its_array_readable_and_its_slot_held(producer):
    p = producer(world_size=1, batches=2, batch_size=2, sample_bytes=32, slots_per_rank=1)
    with ringfeed.attach(p.name, 0, timeout=5) as feed:
        arr = feed.next(timeout=5).array()[1:]  # a derived view; the Batch dies here
        gc.collect()
        assert_slot_still_held(feed)
        np.testing.assert_array_equal(arr[0], expected_sample(1, 32))
        del arr
        assert feed.next(timeout=5).step == 1


def test_a_released_batch_makes_no_new_views_but_keeps_its_metadata(producer):
    p = producer(world_size=1, batches=1, batch_size=2, sample_bytes=32)
    with ringfeed.attach(p.name, 0, timeout=5) as feed:
        batch = feed.next(timeout=5)
        batch.release()
        assert batch.released
        assert (batch.epoch, batch.step, len(batch)) == (0, 0, 2)
        np.testing.assert_array_equal(batch.indices, [0, 1])
        with pytest.raises(ValueError, match="released"):
            batch.sample(0)
        with pytest.raises(ValueError, match="released"):
            batch.array()


def test_releasing_twice_is_a_no_op(producer):
    p = producer(world_size=1, batches=3, batch_size=2, sample_bytes=32, slots_per_rank=1)
    with ringfeed.attach(p.name, 0, timeout=5) as feed:
        batch = feed.next(timeout=5)
        batch.release()
        batch.release()
        assert batch.released and feed.held == 0
        with feed.next(timeout=5) as second:
            assert second.step == 1
        assert second.released
        assert feed.next(timeout=5).step == 2


def test_a_view_dropped_on_another_thread_frees_the_slot_for_a_waiting_next(producer):
    p = producer(world_size=1, batches=2, batch_size=2, sample_bytes=32, slots_per_rank=1)
    with ringfeed.attach(p.name, 0, timeout=5) as feed:
        batch = feed.next(timeout=5)
        holder = [batch.array()]
        batch.release()

        def drop_later():
            time.sleep(0.3)
            holder.pop()  # the last view dies on this thread, mid-next()

        threading.Thread(target=drop_later).start()
        start = time.monotonic()
        assert feed.next(timeout=5).step == 1
        assert time.monotonic() - start < 2.0


def test_next_refuses_to_wait_forever_when_every_slot_is_held(producer):
    p = producer(world_size=1, batches=5, batch_size=2, sample_bytes=32, slots_per_rank=2)
    with ringfeed.attach(p.name, 0, timeout=5) as feed:
        first, second = feed.next(timeout=5), feed.next(timeout=5)
        start = time.monotonic()
        with pytest.raises(ringfeed.AllSlotsHeldError, match="still holds the batch of epoch 0 step 0"):
            feed.next()
        assert time.monotonic() - start < 1.0
        # A finite timeout waits for a view to die elsewhere, then says why.
        with pytest.raises(ringfeed.AllSlotsHeldError, match="holds 2 batch"):
            feed.next(timeout=0.1)
        first.release()
        assert feed.next().step == 2
        second.release()


def test_holding_one_batch_stops_the_rank_k_batches_later_naming_that_batch(producer):
    p = producer(world_size=1, batches=8, batch_size=2, sample_bytes=32, slots_per_rank=4)
    with ringfeed.attach(p.name, 0, timeout=5) as feed:
        kept = feed.next(timeout=5)  # e.g. kept to look at its shapes
        for step in (1, 2, 3):
            with feed.next(timeout=5) as b:
                assert b.step == step
        start = time.monotonic()
        with pytest.raises(ringfeed.AllSlotsHeldError, match=r"slot 0, which still holds the batch of epoch 0 step 0.*4 slot\(s\) a rank, used in turn"):
            feed.next()
        assert time.monotonic() - start < 1.0
        assert feed.held == 1
        kept.release()
        steps = []
        for b in feed:
            steps.append(b.step)
            b.release()
        assert steps == [4, 5, 6, 7]
    assert p.wait() == 0


def test_the_end_is_reported_even_when_every_slot_is_held(producer):
    p = producer(world_size=1, batches=2, batch_size=2, sample_bytes=32, slots_per_rank=2)
    with ringfeed.attach(p.name, 0, timeout=5) as feed:
        held = [feed.next(timeout=5), feed.next(timeout=5)]
        deadline = time.monotonic() + 5
        while True:  # the loader marks the end after its last publish
            try:
                assert feed.next() is None
                break
            except ringfeed.AllSlotsHeldError:
                assert time.monotonic() < deadline
                time.sleep(0.02)
        del held


def test_close_detaches_only_after_the_last_view_dies(producer):
    p = producer(world_size=1, batches=3, batch_size=2, sample_bytes=32, slots_per_rank=2)
    feed = ringfeed.attach(p.name, 0, timeout=5)
    batch = feed.next(timeout=5)
    arr = batch.array()
    feed.close()
    with pytest.raises(ValueError, match="closed"):
        feed.next(timeout=0)
    np.testing.assert_array_equal(arr[1], expected_sample(1, 32))  # still mapped
    with pytest.raises(ringfeed.RankBusyError, match="not given back"):
        ringfeed.attach(p.name, 0, timeout=0.3)  # still attached
    del batch, arr
    gc.collect()
    with ringfeed.attach(p.name, 0, timeout=5) as again:
        # The new consumer goes on after the last batch taken.
        steps = []
        for b in again:
            steps.append(b.step)
            b.release()
        assert steps == [1, 2]
    assert p.wait() == 0


def _stopped(pid):
    with open("/proc/%d/stat" % pid) as f:
        return f.read().rsplit(")", 1)[1].split()[0] in ("T", "t")


def test_ctrl_c_interrupts_a_waiting_next(producer):
    p = producer(world_size=1, batches=3, batch_size=2, sample_bytes=32, slots_per_rank=2)
    with ringfeed.attach(p.name, 0, timeout=5) as feed:
        held = [feed.next(timeout=5), feed.next(timeout=5)]
        # A stopped loader is alive but publishes nothing: next() waits.
        os.kill(p.proc.pid, signal.SIGSTOP)
        try:
            deadline = time.monotonic() + 5
            while not _stopped(p.proc.pid):
                assert time.monotonic() < deadline
                time.sleep(0.005)
            del held
            gc.collect()
            timer = threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGINT))
            timer.start()
            start = time.monotonic()
            with pytest.raises(KeyboardInterrupt):
                feed.next(timeout=30)
            assert time.monotonic() - start < 1.5
            timer.join()
        finally:
            os.kill(p.proc.pid, signal.SIGCONT)
        assert feed.next(timeout=5).step == 2


@pytest.mark.parametrize("when", ["before the Batch is made", "after the Batch is made"])
def test_a_batch_taken_as_ctrl_c_strikes_is_what_the_next_call_returns(producer, monkeypatch, when):
    import ringfeed._feed as feed_module

    p = producer(world_size=1, batches=6, batch_size=2, sample_bytes=32, slots_per_rank=2)
    real_init = feed_module.Batch.__init__
    strikes = []

    def interrupted_init(self, *args):
        if when == "after the Batch is made":
            real_init(self, *args)
        if not strikes:
            strikes.append(1)
            raise KeyboardInterrupt
        if when == "before the Batch is made":
            real_init(self, *args)

    steps = []
    with ringfeed.attach(p.name, 0, timeout=5) as feed:
        with feed.next(timeout=5) as b:
            steps.append(b.step)
        monkeypatch.setattr(feed_module.Batch, "__init__", interrupted_init)
        _interrupted_next_then_the_rest(p, feed, steps)
    assert steps == [0, 1, 2, 3, 4, 5]
    assert p.wait() == 0


def _interrupted_next_then_the_rest(p, feed, steps):
    """A next() that Ctrl-C interrupts keeps the batch it took for the next
    call; then every batch left, checked, steps appended to ``steps``."""
    with pytest.raises(KeyboardInterrupt):
        feed.next(timeout=5)
    gc.collect()  # a half-made Batch, if any, dies here
    assert feed.held == 1  # taken, not lost, not given back
    for b in feed:
        p.check_batch(b, b.step, 0)
        steps.append(b.step)
        b.release()


def test_a_batch_is_not_lost_to_ctrl_c_striking_as_next_leaves_the_call_lock(producer):
    # The window after _call_next let go of call_lock and before it returned:
    # the Batch died with the frame and its slot was given back, unseen.
    p = producer(world_size=1, batches=6, batch_size=2, sample_bytes=32, slots_per_rank=2)

    class StrikingLock:
        def __init__(self, lock):
            self.lock, self.strike = lock, False

        def acquire(self, *a, **k):
            return self.lock.acquire(*a, **k)

        def release(self):
            self.lock.release()

        def __enter__(self):
            self.lock.acquire()
            return self

        def __exit__(self, *exc):
            self.lock.release()
            if self.strike and exc[0] is None:
                self.strike = False
                raise KeyboardInterrupt

    steps = []
    with ringfeed.attach(p.name, 0, timeout=5) as feed:
        handle = feed._handle
        handle.call_lock = StrikingLock(handle.call_lock)
        handle.call_lock.strike = True
        _interrupted_next_then_the_rest(p, feed, steps)
    assert steps == [0, 1, 2, 3, 4, 5]
    assert p.wait() == 0


def test_ctrl_c_inside_the_give_back_of_a_slot_neither_loses_the_slot_nor_is_swallowed(producer, monkeypatch):
    # A KeyboardInterrupt in a weakref finalizer is printed and dropped by
    # Python; striking before rf_release it also kept the slot taken for good
    # (AllSlotsHeldError K batches later, naming a batch given back).
    p = producer(world_size=1, batches=6, batch_size=2, sample_bytes=32, slots_per_rank=2)
    with ringfeed.attach(p.name, 0, timeout=5) as feed:
        handle = feed._handle
        real_release_now = type(handle).release_now
        strikes = []

        def striking_release_now(self, raw):
            if not strikes:
                strikes.append(1)
                raise KeyboardInterrupt  # before rf_release
            return real_release_now(self, raw)

        monkeypatch.setattr(type(handle), "release_now", striking_release_now)
        b = feed.next(timeout=5)
        with pytest.raises(KeyboardInterrupt):
            b.release()  # the finalizer runs here, and the Ctrl-C is raised again after it
            for _ in range(1000):  # where the main thread runs next
                time.sleep(0.001)
        assert strikes == [1]
        steps = [b.step]
        del b
        for b in feed:  # the queued slot is given back by the next call
            p.check_batch(b, b.step, 0)
            steps.append(b.step)
            b.release()
        assert feed.held == 0
    assert steps == [0, 1, 2, 3, 4, 5]
    assert p.wait() == 0


@pytest.mark.parametrize("taken_back_by_next", [False, True], ids=["the finalizer's own", "taken back by next()"])
def test_a_ctrl_c_in_a_give_back_queues_only_a_slot_that_finalizer_took(producer, monkeypatch, taken_back_by_next):
    # next() takes a claim back when Ctrl-C struck before its batch reached
    # the caller, and hands that slot out again itself; a finalizer
    # interrupted then must not queue it too (the next call would give back
    # a slot whose batch is about to be returned).
    import ringfeed._handle as feed_module  # the slots' give-back

    p = producer(world_size=1, batches=2, batch_size=2, sample_bytes=32, slots_per_rank=2)
    with ringfeed.attach(p.name, 0, timeout=5) as feed:
        handle = feed._handle
        claim = feed_module.Claim()
        if taken_back_by_next:
            claim.take_back(handle)

        def strike(handle, raw, claim):
            if not taken_back_by_next:
                claim.take_back(handle, feed_module._BY_FINALIZER)
            raise KeyboardInterrupt

        monkeypatch.setattr(feed_module, "_give_back_now", strike)
        raw = object()
        with pytest.raises(KeyboardInterrupt):
            feed_module.give_back(handle, raw, claim)  # returns: a finalizer does not raise
            for _ in range(1000):  # the Ctrl-C, raised again where the main thread runs
                time.sleep(0.001)
        assert list(handle.pending) == ([] if taken_back_by_next else [raw])
        handle.pending.clear()
        monkeypatch.undo()
        for b in feed:
            b.release()
    assert p.wait() == 0


def test_dropping_the_loop_variable_frees_its_slot_before_the_next_batch_is_asked_for(producer):
    # The iterator's own frame kept the batch until next() returned: with one
    # slot per rank, `del batch` in the loop body then met AllSlotsHeldError.
    p = producer(world_size=1, batches=5, batch_size=2, sample_bytes=32, slots_per_rank=1)
    steps = []
    with ringfeed.attach(p.name, 0, timeout=5) as feed:
        for batch in feed:
            steps.append(batch.step)
            data = batch.array().copy()
            del batch
        assert data.nbytes == 64
    assert steps == [0, 1, 2, 3, 4]
    assert p.wait() == 0


def test_a_forked_child_cannot_take_or_give_back_the_parents_batches(producer):
    p = producer(world_size=1, batches=4, batch_size=2, sample_bytes=64, slots_per_rank=2)
    with ringfeed.attach(p.name, 0, timeout=5) as feed:
        batch = feed.next(timeout=5)
        view = batch.array()
        before = view.copy()
        pid = os.fork()
        if pid == 0:  # the child: it must fail cleanly, and give nothing back
            code = 1
            try:
                try:
                    feed.next(timeout=1)
                except ringfeed.ForkedError as e:
                    code = 0 if "attach in the child" in str(e).lower() else 2
                del batch, view
                feed.close()
                gc.collect()
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        time.sleep(0.1)  # a wrongful give-back would let the loader overwrite now
        np.testing.assert_array_equal(view, before)
        p.check_batch(batch, 0, 0)
        del view
        batch.release()
        steps = []
        for b in feed:
            steps.append(b.step)
            b.release()
        assert steps == [1, 2, 3]  # nothing taken twice, nothing skipped
    assert p.wait() == 0


def test_a_forked_child_raises_forked_even_while_a_parent_thread_was_inside_next(producer):
    p = producer(world_size=1, batches=4, batch_size=2, sample_bytes=64, slots_per_rank=2)
    with ringfeed.attach(p.name, 0, timeout=5) as feed:
        handle = feed._handle
        assert handle.call_lock.acquire()  # as a thread of the parent inside next() at the fork
        try:
            pid = os.fork()
            if pid == 0:
                code = 1
                try:
                    signal.alarm(10)  # a hang in the child fails the test, not the run
                    try:
                        feed.next(timeout=1)
                    except ringfeed.ForkedError as e:
                        code = 0 if "attach in the child" in str(e).lower() else 2
                finally:
                    os._exit(code)
            _, status = os.waitpid(pid, 0)
        finally:
            handle.call_lock.release()
        assert os.waitstatus_to_exitcode(status) == 0
        assert [b.step for b in feed] == [0, 1, 2, 3]
    assert p.wait() == 0


def test_feeds_and_batches_refuse_pickling_saying_what_to_send_instead(producer):
    import copy
    import pickle

    p = producer(world_size=1, batches=2, batch_size=2, sample_bytes=32, slots_per_rank=2)
    with ringfeed.attach(p.name, 0, timeout=5) as feed:
        with pytest.raises(TypeError, match="Feed cannot be pickled.*num_workers=0"):
            pickle.dumps(feed)
        batch = feed.next(timeout=5)
        with pytest.raises(TypeError, match="Batch cannot be pickled.*copy"):
            pickle.dumps(batch)
        twin = copy.copy(batch)  # a second Batch of the same slot
        batch.release()
        assert not batch.released  # the twin still holds the slot
        p.check_batch(twin, 0, 0)
        twin.release()
        assert batch.released and twin.released
        assert [b.step for b in feed] == [1]


def test_a_forked_child_that_outlives_its_trainer_does_not_keep_the_rank(producer):
    """A rank's lock lasts while any copy of its descriptor is open. A forked
    child (an orphaned multiprocessing worker) that outlives a trainer killed
    by SIGKILL must not keep the rank locked: the restarted trainer attaches
    and gets the batches its predecessor never took."""
    import signal

    p = producer(world_size=1, batches=4, batch_size=2, sample_bytes=64, slots_per_rank=2)
    script = (
        "import os, signal, sys, time\n"
        "import ringfeed\n"
        "feed = ringfeed.attach(sys.argv[1], 0, timeout=5)\n"
        "b = feed.next(timeout=5)\n"
        "pid = os.fork()\n"
        "if pid == 0:\n"
        "    null = os.open(os.devnull, os.O_RDWR)\n"
        "    os.dup2(null, 1)\n"
        "    os.dup2(null, 2)\n"
        "    time.sleep(60)\n"
        "    os._exit(0)\n"
        "print(pid, flush=True)\n"
        "os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    trainer = run_script(script, p.name)
    assert trainer.returncode == -signal.SIGKILL, trainer.stderr.decode()
    child = int(trainer.stdout.split()[0])
    try:
        assert os.path.exists("/proc/%d" % child), "the forked child should still be running"
        with ringfeed.attach(p.name, 0, timeout=5) as feed:
            steps = []
            for b in feed:
                steps.append(b.step)
                b.release()
        # Batch 0 was taken by the killed trainer: a new trainer of the rank
        # continues with the next one it did not take.
        assert steps == [1, 2, 3]
    finally:
        os.kill(child, signal.SIGKILL)
    assert p.wait() == 0


def test_a_view_read_by_a_del_in_a_reference_cycle_is_neither_refilled_nor_unmapped(producer):
    """Review: a collection runs weakref callbacks (which give slots back and
    detach feeds) before the __del__ of the cycle's other objects. A __del__
    that read a view of a released batch of a closed feed segfaulted, and one
    of an open feed read a slot the loader had refilled. The binding now waits
    for the collection's end before giving back or detaching."""
    p = producer(world_size=1, batches=6, batch_size=2, sample_bytes=64, slots_per_rank=2)
    script = (
        "import gc, sys, time\n"
        "import numpy as np\n"
        "import ringfeed\n"
        "feed = ringfeed.attach(sys.argv[1], 0, timeout=5)\n"
        "b1 = feed.next(timeout=5); b2 = feed.next(timeout=5)\n"
        "class Holder:\n"
        "    def __del__(self):\n"
        "        time.sleep(0.2)  # the loader would refill a slot given back meanwhile\n"
        "        print(int(self.index), bytes(self.view).hex(), flush=True)\n"
        "h = Holder(); h.view = b1.sample(0); h.index = b1.indices[0]; h.me = h\n"
        "g = Holder(); g.view = b2.sample(0); g.index = b2.indices[0]; g.me = g\n"
        "b1.release(); b2.release(); del b1, b2, h\n"
        "gc.collect()  # h's __del__ reads a view of an open feed\n"
        "print('next', int(feed.next(timeout=5).indices[0]), flush=True)\n"
        "feed.close(); del feed, g\n"
        "gc.collect()  # g's __del__ reads a view of a closed feed\n"
        "print('survived', flush=True)\n"
    )
    run = run_script(script, p.name)
    out = run.stdout.decode().split("\n")
    assert run.returncode == 0, (run.returncode, run.stdout.decode(), run.stderr.decode())
    assert out[-2] == "survived", out
    reads = [line.split() for line in out if line and line[0].isdigit()]
    assert [int(r[0]) for r in reads] == [0, 2], out
    for index, hexbytes in reads:
        assert bytes.fromhex(hexbytes) == expected_sample(int(index), 64).tobytes(), (index, out)
    assert "next 4" in out, out


def test_next_waiting_for_a_slot_wakes_when_another_thread_drops_its_last_view(producer):
    """Review: a view that died on another thread while next() waited for its
    slot was given back at once, but next() slept out its whole 150 ms slice."""
    p = producer(world_size=1, batches=40, batch_size=2, sample_bytes=64, slots_per_rank=2)
    waits = []
    with ringfeed.attach(p.name, 0, timeout=5) as feed:
        for _ in range(7):
            views = []
            for _ in range(2):
                b = feed.next(timeout=5)
                views.append(b.array())
                b.release()
            dropper = threading.Timer(0.01, views.clear)
            dropper.start()
            t0 = time.monotonic()
            b = feed.next(timeout=5)
            waits.append(time.monotonic() - t0)
            dropper.join()
            b.release()
            del b
        feed.close()
    waits.sort()
    assert waits[3] < 0.1, "next() took %s s after the view died 0.01 s in" % ["%.3f" % w for w in waits]
