"""Batch: one taken slot, its metadata copied out and its bytes viewed in
place. Every view keeps the slot's base alive; the base's finalizer
(``_handle.give_back``) gives the slot back when the last one dies."""

import contextlib
import ctypes
import functools
import os
import weakref

import numpy as np

from . import _handle, _lib, errors, tar
from ._lib import LIB

_SAMPLE_DTYPE = np.dtype([("offset", "<u8"), ("len", "<u8"), ("index", "<u8")])
assert _SAMPLE_DTYPE.itemsize == ctypes.sizeof(_lib.rf_sample)


@functools.lru_cache(maxsize=256)
def _base_type(nbytes):
    # A Python subclass of the ctypes array: unlike the array type itself, its
    # instances accept weak references (needed by weakref.finalize).
    return type("SlotPayload", (ctypes.c_ubyte * nbytes,), {})


class Batch:
    """One batch of this rank: metadata copied out, bytes viewed in place.

    The slot is given back to the loader exactly once, when both the batch has
    been released (``release()``, leaving a ``with`` block, or dropping the
    Batch) and every view made from it is gone. ``release()`` never leaves a
    dangling view: while views are alive it only defers.
    """

    __slots__ = ("_base", "_finalizer", "_table", "_spans", "_resume", "_images", "_tokens", "epoch", "step", "slot",
                 "generation", "nbytes", "data_ptr")

    def __init__(self, handle, raw, claim):
        n = raw.n_samples
        # The sample table lives in the library's private memory, reused when
        # this slot is reused: copy it (24 bytes a sample).
        table_bytes = ctypes.string_at(raw.samples, n * _SAMPLE_DTYPE.itemsize) if n else b""
        self._table = np.frombuffer(table_bytes, dtype=_SAMPLE_DTYPE)
        # (offsets, lengths) as lists of ints, made on first use (_sample_spans).
        self._spans = None
        self.epoch = raw.epoch
        self.step = raw.step
        self.slot = raw.slot
        self.generation = raw.generation
        self.nbytes = raw.data_len
        self.data_ptr = raw.data or 0
        self._resume = handle.resume
        self._images = handle.images
        self._tokens = getattr(handle, "tokens", None)
        self._base = _base_type(raw.data_len).from_address(self.data_ptr)
        self._finalizer = weakref.finalize(self._base, _handle.give_back, handle, raw, claim)
        self._finalizer.atexit = False
        handle.claims.add(claim)

    def __len__(self):
        return len(self._table)

    def __copy__(self):
        # Another Batch on the same slot (copy.copy): shares its base, so the
        # slot is given back once both are released and their views gone.
        twin = object.__new__(Batch)
        for attr in Batch.__slots__:
            object.__setattr__(twin, attr, getattr(self, attr))
        return twin

    def __reduce__(self):
        raise TypeError(
            "a ringfeed Batch cannot be pickled, deep-copied or sent to another process: its bytes are a view of "
            "the loader's ring. Send a copy of the data instead (e.g. batch.array().copy(), or "
            "torch.from_numpy(batch.array()).clone())"
        )

    def __repr__(self):
        state = "released" if self.released else ("releasing" if self._base is None else "held")
        return "<ringfeed.Batch epoch=%d step=%d samples=%d nbytes=%d %s>" % (
            self.epoch,
            self.step,
            len(self),
            self.nbytes,
            state,
        )

    @property
    def resume_state(self):
        """``(epoch, samples)``: once every rank of the job has trained on its
        batch of this step, ``ringfeed serve ... --resume EPOCH:SAMPLES`` (same
        dataset, seed and batch size, any world size) goes on with the next
        step. Save it in your checkpoint. None if the loader does not record
        where it started (an older ``ringfeed serve``).

        ``step`` counts from the loader's own ``--resume`` point in the epoch
        it started in, so ``(step + 1) * W * B`` alone is the state only for a
        loader started at the beginning of an epoch; this adds that start.
        After an epoch's last step it is ``(epoch + 1, 0)``: the epoch's
        dropped tail is not carried over (docs/sampler.md, section 3); with
        ``--tail keep`` the last step is the short one.
        """
        # The rule of Job::resume_state_after (engine/ring/src/layout.rs), as
        # rf_resume_after gives it without a feed: a released batch may
        # outlive its feed's attachment. The end-to-end resume test checks
        # that it agrees with rf_resume_state on every batch.
        if self._resume is None:
            return None
        (start_epoch, start_samples), dataset_samples, per_step, tail = self._resume
        if self.epoch < start_epoch:
            return None  # not a batch of this loader
        before = start_samples if self.epoch == start_epoch else 0
        return LIB.resume_rule("rf_resume_after", self.epoch, before, self.step + 1, dataset_samples, per_step,
                               tail=tail)

    @property
    def images(self):
        """The batch's decoded images (``serve --decode image``), zero-copy: a
        numpy uint8 array of ``(n, 3, H, W)`` (or ``(n, H, W, 3)`` with
        ``--layout hwc``). ``torch.from_numpy(batch.images)`` is a tensor of
        the same memory."""
        fmt = self._image_format()
        shape = (3, fmt.height, fmt.width) if fmt.chw else (fmt.height, fmt.width, 3)
        per = 3 * fmt.height * fmt.width
        n = len(self)
        whole = np.frombuffer(self._live_base(), dtype=np.uint8, count=n * per)
        return whole.reshape((n,) + shape)

    @property
    def labels(self):
        """Each image's label, zero-copy: a numpy int64 array (-1: no label)."""
        fmt = self._image_format()
        return np.frombuffer(self._live_base(), dtype="<i8", count=len(self), offset=fmt.labels_offset)

    @property
    def bad(self):
        """Each image's flag, zero-copy: a numpy bool array, True where the
        sample could not be decoded and is a zero image (``--on-bad-sample
        zero``)."""
        fmt = self._image_format()
        return np.frombuffer(self._live_base(), dtype=np.bool_, count=len(self), offset=fmt.bad_offset)

    def _image_format(self):
        if self._images is None:
            raise ValueError(
                "this loader serves the objects' bytes, not decoded images: start it with --decode image "
                "(or read the bytes with sample(i), samples() or array())"
            )
        return self._images

    @property
    def tokens(self):
        """The batch's token windows (``serve --seq-len L``), zero-copy: a
        numpy array of ``(n, L + 1)`` in the corpus's dtype (inputs
        ``[:, :-1]``, targets ``[:, 1:]``)."""
        fmt = self._token_format()
        n = len(self)
        whole = np.frombuffer(self._live_base(), dtype=fmt.dtype, count=n * (fmt.seq_len + 1))
        return whole.reshape((n, fmt.seq_len + 1))

    @property
    def doc_counts(self):
        """How many documents start in each window, zero-copy: numpy uint32
        of ``(n,)``; a count above ``doc_starts_max`` means only the first
        ``doc_starts_max`` starts are kept."""
        fmt = self._token_format()
        return np.frombuffer(self._live_base(), dtype="<u4", count=len(self), offset=fmt.doc_counts_offset)

    @property
    def doc_starts(self):
        """Where documents start in each window (token offsets 0 to L,
        ascending), zero-copy: numpy uint32 of ``(n, doc_starts_max)``; row
        i's first ``min(doc_counts[i], doc_starts_max)`` entries are valid."""
        fmt = self._token_format()
        n, room = len(self), fmt.doc_starts_max
        whole = np.frombuffer(self._live_base(), dtype="<u4", count=n * room, offset=fmt.doc_starts_offset)
        return whole.reshape((n, room))

    def cu_seqlens(self, length=None):
        """FlashAttention's ``cu_seqlens`` for the first ``length`` tokens of
        every window (default L: the inputs), packed window after window: an
        int32 numpy array ``[0, ..., n * length]`` cutting at every document
        start and at every window's end. With ``max_seqlen = np.diff(cu).max()``
        it is what ``flash_attn_varlen_func`` takes. A window whose starts
        were cut short (``doc_counts > doc_starts_max``) joins its last
        documents into one."""
        fmt = self._token_format()
        length = fmt.seq_len if length is None else int(length)
        if not 1 <= length <= fmt.seq_len + 1:
            raise ValueError("length %d is not from 1 to %d tokens (L + 1)" % (length, fmt.seq_len + 1))
        n = len(self)
        if n == 0:
            return np.zeros(1, dtype=np.int32)
        counts = np.minimum(self.doc_counts, fmt.doc_starts_max).astype(np.int64)
        starts = self.doc_starts.astype(np.int64)
        valid = (np.arange(fmt.doc_starts_max)[None, :] < counts[:, None]) & (starts > 0) & (starts < length)
        rows = np.nonzero(valid)[0]
        cuts = starts[valid] + rows * length
        ends = np.arange(n + 1, dtype=np.int64) * length
        return np.union1d(ends, cuts).astype(np.int32)

    def position_ids(self, length=None):
        """Each token's position within its document, for the first
        ``length`` tokens of every window (default L): int64 numpy of
        ``(n, length)``, 0 at every document start and at every window's
        start (a document that began in an earlier window counts from 0)."""
        fmt = self._token_format()
        length = fmt.seq_len if length is None else int(length)
        cu = self.cu_seqlens(length).astype(np.int64)
        total = len(self) * length
        pos = np.arange(total, dtype=np.int64) - np.repeat(cu[:-1], np.diff(cu))
        return pos.reshape((len(self), length))

    def _token_format(self):
        if self._tokens is None:
            raise ValueError(
                "this loader serves the objects' bytes, not token windows: start it with --seq-len L "
                "(or read the bytes with sample(i), samples() or array())"
            )
        return self._tokens

    @property
    def indices(self):
        """Manifest index of each sample: a new numpy uint64 array."""
        return np.array(self._table["index"], dtype=np.uint64)

    @property
    def offsets(self):
        """Byte offset of each sample from the start of the batch payload."""
        return np.array(self._table["offset"], dtype=np.uint64)

    @property
    def lengths(self):
        """Byte length of each sample."""
        return np.array(self._table["len"], dtype=np.uint64)

    @property
    def released(self):
        """True once the slot is given back to the loader (all views gone)."""
        return not self._finalizer.alive

    def release(self):
        """Gives the slot back now, or, while views are alive, when the last
        one dies. A second call does nothing."""
        self._base = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.release()
        return False

    def _live_base(self):
        if self._base is None:
            raise ValueError("this batch was released: it can make no new views (views made before stay valid)")
        return self._base

    def buffer(self):
        """Zero-copy memoryview of the whole payload (``nbytes`` bytes)."""
        return memoryview(self._live_base()).cast("B")

    def sample(self, i):
        """Zero-copy memoryview of sample ``i``'s bytes. For every sample of a
        batch at once, ``samples()`` costs a fraction of a loop over this."""
        base = self._live_base()
        offsets, lengths = self._sample_spans()
        n = len(offsets)
        if not -n <= i < n:
            raise IndexError("sample %d out of range: the batch has %d samples" % (i, n))
        start = offsets[i]
        return memoryview(base).cast("B")[start : start + lengths[i]]

    @property
    def data(self):
        """Zero-copy numpy uint8 array of the whole payload (``nbytes``
        bytes): sample ``i`` is ``data[offsets[i] : offsets[i] + lengths[i]]``.
        Like every view, it keeps the slot while it lives."""
        return np.frombuffer(self._live_base(), dtype=np.uint8)

    def samples(self, numpy=False):
        """Every sample's bytes at once, zero-copy: a list of memoryviews, the
        same as ``[batch.sample(i) for i in range(len(batch))]`` at a fraction
        of its cost; ``numpy=True`` gives numpy uint8 arrays instead (views of
        ``data``). Samples may differ in size."""
        base = self._live_base()
        whole = np.frombuffer(base, dtype=np.uint8) if numpy else memoryview(base).cast("B")
        offsets, lengths = self._sample_spans()
        return [whole[o : o + n] for o, n in zip(offsets, lengths)]

    def stack(self, dtype="uint8"):
        """The samples as one ``(samples, length // itemsize)`` numpy array of
        ``dtype``, when every sample has the same length: a zero-copy view
        (which keeps the slot) when they lie at a constant stride in the slot,
        end to end or evenly spaced; else one vectorised copy (which does not).
        Raises ValueError naming the first sample that differs in size, or
        when a sample is not a whole number of ``dtype`` items. ``array()`` is
        the stricter view of the whole payload, in any shape."""
        base = self._live_base()
        dt = np.dtype(dtype)
        if dt.itemsize == 0 or dt.hasobject:
            raise ValueError("dtype %s cannot view raw bytes" % dt)
        n = len(self._table)
        length, stride = self._layout()
        if length % dt.itemsize:
            raise ValueError("a sample of %d bytes is not a whole number of %s items (%d bytes each)" % (length, dt, dt.itemsize))
        shape = (n, length // dt.itemsize)
        if n == 0:
            return np.empty(shape, dtype=dt)
        if stride is not None:
            return np.ndarray(shape, dtype=dt, buffer=base, offset=int(self._table["offset"][0]), strides=(stride, dt.itemsize))
        whole = np.frombuffer(base, dtype=np.uint8)
        offsets, _ = self._sample_spans()
        return np.concatenate([whole[o : o + length] for o in offsets]).view(dt).reshape(shape)

    def _sample_spans(self):
        if self._spans is None:
            self._spans = (self._table["offset"].tolist(), self._table["len"].tolist())
        return self._spans

    def _layout(self):
        """``(length, stride)`` of equal-sized samples: ``stride`` the bytes
        from one sample's start to the next's when constant (and the samples
        do not overlap), else None. ValueError when the sizes differ."""
        n = len(self._table)
        if n == 0:
            return 0, None
        lens = self._table["len"]
        length = int(lens[0])
        unequal = np.flatnonzero(lens != lens[0])
        if unequal.size:
            i = int(unequal[0])
            raise ValueError("samples differ in size (sample 0 has %d bytes, sample %d has %d): use samples() or sample(i)" % (length, i, int(lens[i])))
        if n == 1:
            return length, max(length, 1)
        offsets = self._table["offset"]
        steps = offsets[1:] - offsets[:-1]  # uint64: a step back wraps to a huge one
        stride = int(steps[0])
        if stride < length or int(offsets[0]) + (n - 1) * stride + length > self.nbytes or (steps != steps[0]).any():
            return length, None
        return length, stride

    def fields(self, i, lowercase=True):
        """``{field: memoryview}`` of sample ``i`` when the loader serves tar
        shards (``--format tar``): each member's data, zero-copy, keyed by its
        extension lowercased as WebDataset does (``000123.jpg`` -> ``"jpg"``,
        ``s1.JPG`` -> ``"jpg"``; ``lowercase=False`` keeps it as stored;
        ``ringfeed.tar.members(batch.sample(i))`` gives the members' names).
        ``np.frombuffer(view, np.uint8)`` is a numpy view of the same bytes.
        Raises ``ringfeed.tar.FieldError`` when the sample is not tar members."""
        return tar.fields(self.sample(i), lowercase)

    def key(self, i):
        """Sample ``i``'s key, relative to the source: the object's key
        (``"cat/0001.jpg"``, local or remote), a tar sample's WebDataset key
        (``"a/b/000123"``, also under ``--decode image``), or for
        ``--record-bytes`` the tuple ``(key, record)``: the object's key and
        the record's index in it. A str (bytes that are not UTF-8 kept as
        surrogate escapes, as ``os.fsdecode`` does). ``keys()`` gives all."""
        n = len(self)
        if not -n <= i < n:
            raise IndexError("sample %d out of range: the batch has %d samples" % (i, n))
        return self._keys([i % n])[0]

    def keys(self):
        """Every sample's key (see ``key``), a list in sample order."""
        return self._keys(range(len(self)))

    def _keys(self, which):
        self._live_base()
        alive = self._finalizer.peek()
        if alive is None:
            raise ValueError("this batch was released: its keys are gone with its slot")
        _, _, (handle, raw, _), _ = alive
        if not LIB.has("rf_batch_key"):
            return [tar.key(self.sample(i)) for i in which]
        out, key = [], _lib.rf_key()
        # A forked child must not wait on a call_lock its parent's thread held
        # at the fork; reading a key there only reads the mapping.
        lock = handle.call_lock if handle.pid == os.getpid() else contextlib.nullcontext()
        with lock:
            for i in which:
                rc = LIB.rf_batch_key(handle.ptr, ctypes.byref(raw), i, ctypes.byref(key))
                if rc == _lib.RF_E_VERSION:
                    # A loader that keeps no keys: tar samples still carry theirs.
                    return [tar.key(self.sample(j)) for j in which]
                if rc != _lib.RF_OK:
                    raise errors.error_for(rc, LIB.last_error())
                text = ctypes.string_at(key.key, key.len).decode("utf-8", "surrogateescape") if key.len else ""
                out.append(text if key.record == _lib.NOT_A_RECORD else (text, key.record))
        return out

    def array(self, dtype="uint8", shape=None):
        """Zero-copy numpy view of the payload as ``shape`` items of ``dtype``.

        Needs fixed-size samples laid end to end (sample i at offset i*len):
        raises ValueError saying why otherwise. ``shape`` defaults to
        (samples, len // itemsize); one entry may be -1. The array is writable:
        the slot belongs to this process until it is given back.
        """
        base = self._live_base()
        dt = np.dtype(dtype)
        if dt.itemsize == 0 or dt.hasobject:
            raise ValueError("dtype %s cannot view raw bytes" % dt)
        sample_bytes = self._fixed_sample_bytes()
        total = len(self._table) * sample_bytes
        if total % dt.itemsize:
            raise ValueError("the batch's %d bytes are not a whole number of %s items (%d bytes each)" % (total, dt, dt.itemsize))
        if shape is None:
            if sample_bytes % dt.itemsize:
                raise ValueError("a sample of %d bytes is not a whole number of %s items; pass a shape" % (sample_bytes, dt))
            shape = (len(self._table), sample_bytes // dt.itemsize)
        shape = _check_shape(shape, total // dt.itemsize, dt, total)
        flat = np.frombuffer(base, dtype=dt, count=total // dt.itemsize, offset=0)
        return flat.reshape(shape)

    def _fixed_sample_bytes(self):
        """The common sample length, checking samples are equal-sized and end to end."""
        if len(self._table) == 0:
            return 0
        sample_bytes, stride = self._layout()
        offsets = self._table["offset"]
        if int(offsets[0]) == 0 and (stride == sample_bytes or len(offsets) == 1):
            return sample_bytes
        expected = np.arange(len(offsets), dtype=np.uint64) * np.uint64(sample_bytes)
        i = int(np.flatnonzero(offsets != expected)[0])
        raise ValueError(
            "samples are not laid end to end (sample %d is at offset %d, not %d): use stack() or sample(i)"
            % (i, int(offsets[i]), int(expected[i]))
        )


def disown(batch):
    """Disarms ``batch``'s give-back (next() hands its slot out again):
    ``(raw, claim)`` of the slot, or None if it was given back already."""
    gone = batch._finalizer.detach()  # (base, give_back, (handle, raw, claim), {}), or None
    if gone is None:
        return None
    _, _, (_, raw, claim), _ = gone
    return raw, claim


def _check_shape(shape, count, dt, total):
    """The shape as a tuple if it holds exactly ``count`` items, else ValueError."""
    if isinstance(shape, (int, np.integer)):
        shape = (shape,)
    shape = tuple(int(d) for d in shape)
    if any(d < -1 for d in shape) or shape.count(-1) > 1:
        raise ValueError("invalid shape %r: dimensions must be >= 0, with at most one -1" % (shape,))
    known = 1
    for d in shape:
        if d != -1:
            known *= d
    if -1 in shape:
        if known == 0 or count % known:
            raise ValueError("shape %r cannot hold the batch's %d %s items (%d bytes)" % (shape, count, dt, total))
        return tuple(count // known if d == -1 else d for d in shape)
    if known != count:
        raise ValueError(
            "shape %r holds %d %s items (%d bytes) but the batch has %d bytes"
            % (shape, known, dt, known * dt.itemsize, total)
        )
    return shape
