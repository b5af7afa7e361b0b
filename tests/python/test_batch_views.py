"""The vectorised views of a batch (issue 29: the consumer side of a
small-sample batch): ``data``, ``samples()``, ``stack()``, ``offsets`` and
``lengths`` give what the per-sample views give, and keep the slot as they do.

Against the test loader (samples end to end), and against batches made here
over memory of the test's own, for the layouts the loader may also give:
evenly spaced samples with gaps, samples in any order, unequal sizes, none."""
import collections
import ctypes
import gc
import threading

import numpy as np
import pytest

import ringfeed
from ringfeed import _handle, _lib


def assert_same_as_per_sample(batch):
    n = len(batch)
    per_sample = [bytes(batch.sample(i)) for i in range(n)]
    assert [bytes(v) for v in batch.samples()] == per_sample
    as_numpy = batch.samples(numpy=True)
    assert all(isinstance(a, np.ndarray) and a.dtype == np.uint8 for a in as_numpy)
    assert [a.tobytes() for a in as_numpy] == per_sample
    offsets, lengths = batch.offsets, batch.lengths
    assert offsets.dtype == np.uint64 and lengths.dtype == np.uint64
    data = batch.data
    assert data.dtype == np.uint8 and data.shape == (batch.nbytes,)
    assert [data[o : o + m].tobytes() for o, m in zip(offsets.tolist(), lengths.tolist())] == per_sample
    return per_sample


def test_the_vectorised_views_of_a_loader_batch_equal_its_per_sample_views(producer):
    p = producer(world_size=1, batches=3, batch_size=64, sample_bytes=4096, slots_per_rank=2)
    with ringfeed.attach(p.name, 0, timeout=5) as feed:
        for batch in feed:
            p.check_batch(batch, batch.step, 0)
            per_sample = assert_same_as_per_sample(batch)
            stacked = batch.stack()
            assert stacked.shape == (64, 4096)
            assert [row.tobytes() for row in stacked] == per_sample
            np.testing.assert_array_equal(stacked, batch.array())
            # A view of the slot, not a copy: the same memory as array().
            assert stacked.__array_interface__["data"][0] == batch.data_ptr
            assert batch.stack("uint32").shape == (64, 1024)
            batch.release()


def test_the_vectorised_views_keep_the_slot_until_the_last_is_gone(producer):
    p = producer(world_size=1, batches=2, batch_size=8, sample_bytes=64, slots_per_rank=2)
    with ringfeed.attach(p.name, 0, timeout=5) as feed:
        batch = feed.next(timeout=5)
        views = [batch.samples(), batch.samples(numpy=True), batch.stack(), batch.data]
        batch.release()
        for i in range(len(views)):
            assert not batch.released, "given back while a view from %d lives" % i
            views[i] = None
        assert batch.released
        with pytest.raises(ValueError, match="released"):
            batch.samples()
        for b in feed:
            b.release()


class FakeHandle:
    """What a Batch needs of its _handle.Handle, over no loader: records the
    slots given back."""

    def __init__(self):
        self.resume = None
        self.images = None
        self.claims = set()
        self.call_lock = threading.Lock()
        self.pending = collections.deque()
        self.queued = threading.Event()
        self.released = []

    def drain_pending(self):
        while self.pending:
            self.release_now(self.pending.popleft())

    def release_now(self, raw):
        self.released.append(raw)
        return _lib.RF_OK, ""


def made_batch(payload, spans):
    """A Batch over ``payload`` (bytes) with samples at ``spans`` [(offset, len)]."""
    data = (ctypes.c_ubyte * max(len(payload), 1)).from_buffer_copy(payload or b"\0")
    table = (_lib.rf_sample * max(len(spans), 1))(*[_lib.rf_sample(o, m, i) for i, (o, m) in enumerate(spans)])
    raw = _lib.rf_batch(data=ctypes.addressof(data), samples=ctypes.addressof(table), n_samples=len(spans),
                        slot=0, epoch=0, step=0, generation=1, data_len=len(payload))
    handle = FakeHandle()
    batch = ringfeed.Batch(handle, raw, _handle.Claim())
    return batch, handle, data


PAYLOAD = bytes(range(256)) * 4


def test_evenly_spaced_samples_with_gaps_stack_as_a_view_where_array_refuses():
    spans = [(16 + 100 * i, 64) for i in range(8)]
    batch, handle, keep = made_batch(PAYLOAD, spans)
    per_sample = assert_same_as_per_sample(batch)
    stacked = batch.stack()
    assert stacked.shape == (8, 64) and stacked.strides == (100, 1)
    assert [row.tobytes() for row in stacked] == per_sample
    assert stacked.__array_interface__["data"][0] == batch.data_ptr + 16  # a view, not a copy
    assert batch.stack("uint16").shape == (8, 32)
    with pytest.raises(ValueError, match="not laid end to end"):
        batch.array()
    del stacked
    batch.release()
    gc.collect()
    assert len(handle.released) == 1


def test_equal_samples_in_any_order_stack_as_one_copy():
    spans = [(512, 32), (0, 32), (64, 32), (900, 32)]
    batch, handle, keep = made_batch(PAYLOAD, spans)
    per_sample = assert_same_as_per_sample(batch)
    stacked = batch.stack()
    assert [row.tobytes() for row in stacked] == per_sample
    batch.release()
    assert handle.released, "a copy must not hold the slot"
    assert stacked.sum() >= 0  # still readable: its own memory


def test_samples_of_unequal_sizes_give_views_but_no_stack():
    spans = [(0, 10), (10, 300), (310, 0), (310, 7)]
    batch, handle, keep = made_batch(PAYLOAD, spans)
    assert [len(v) for v in batch.samples()] == [10, 300, 0, 7]
    assert_same_as_per_sample(batch)
    with pytest.raises(ValueError, match=r"differ in size \(sample 0 has 10 bytes, sample 1 has 300\)"):
        batch.stack()
    with pytest.raises(ValueError, match="is not a whole number of"):
        made_batch(PAYLOAD, [(0, 6), (6, 6)])[0].stack("uint32")
    batch.release()


def test_an_empty_batch_has_empty_vectorised_views():
    batch, handle, keep = made_batch(b"", [])
    assert batch.samples() == [] and batch.samples(numpy=True) == []
    assert batch.stack().shape == (0, 0)
    assert batch.offsets.shape == (0,) and batch.data.shape == (0,)
    batch.release()
