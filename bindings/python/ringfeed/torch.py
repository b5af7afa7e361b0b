"""ringfeed.torch: batches as torch tensors, a DataLoader-shaped loop.

The one module of the package that imports torch (``import ringfeed`` does
not)::

    import ringfeed.torch

    loader = ringfeed.torch.Loader(dtype=torch.uint16, shape=(L,), device="cuda")
    len(loader)                            # steps (batches) of one epoch
    for epoch in loader.epochs():          # every epoch the loader serves
        for tokens in loader:              # one epoch: (B, L) uint16 on the GPU
            loss = model(tokens.long())
            ...
            ckpt = {"model": ..., "data": loader.state_dict()}   # after the step

    # resuming, before the first batch:
    loader.load_state_dict(ckpt["data"])

As a DataLoader's, each ``for batch in loader`` is one epoch (``len(loader)``
steps, fewer in the first epoch of a run resumed mid-epoch), and the next
loop goes on with the next epoch; ``loader.epochs()`` yields the number of
each epoch the loader (``serve --epochs``) still serves. A Loader is a torch
``IterableDataset`` with a length, so it also goes where a DataLoader does:
``torch.utils.data.DataLoader(loader, batch_size=None)`` (the loader batches
and reads; no worker processes), or Lightning's ``Trainer.fit(model,
train_dataloaders=loader)``. ``next(loader)`` takes the next batch whatever
its epoch.

With ``serve --tail keep`` (evaluation: every sample once an epoch), the last
steps' batches are short or empty: a tensor of ``(len(batch), *shape)``,
``(0, *shape)`` for an empty one (a ``-1`` in ``shape`` is then 0), and every
rank still takes ``len(loader)`` steps, so collectives line up.

Each batch becomes one tensor: ``dtype`` (a torch or numpy dtype; uint8 when
left out) and ``shape``, the shape of one sample (the tensor is ``(samples,
*shape)``), or ``batch_shape``, that of the whole batch. Or ``collate``, a
function given the batch's samples as zero-copy uint8 numpy arrays (one per
sample, of any sizes), returning what the loop gets (tensors, or dicts,
lists and tuples of them). ``epoch``, ``step``, ``indices`` and
``resume_state`` are those of the last batch the loop got.

From a loader of token windows (``serve --seq-len L``, docs/tokens.md), with
no argument, each batch is the ``(B, L + 1)`` tensor of the corpus's dtype
(uint16 stays 2 bytes on its way); ``token_dtype=torch.int64`` gives it in
that dtype (converted on the device, after the copy, on a GPU), and
``cu_seqlens=True`` makes each batch a ``TokenBatch(tokens, cu_seqlens,
max_seqlen)``: FlashAttention's varlen boundaries of the inputs (the first L
tokens of every window, cut at each document start)::

    loader = ringfeed.torch.Loader(device="cuda", token_dtype=torch.long, cu_seqlens=True)
    for b in loader:
        x, y = b.tokens[:, :-1], b.tokens[:, 1:]
        out = flash_attn_varlen_func(q, k, v, b.cu_seqlens, b.cu_seqlens, b.max_seqlen, b.max_seqlen)

From a loader that decodes images (``serve --decode image``), with no
argument, each batch is ``(images, labels)``: a ``(B, 3, H, W)`` uint8 tensor
(``(B, H, W, 3)`` with ``--layout hwc``) and a ``(B,)`` int64 tensor, views of
the slot on the CPU. Normalise on the GPU, in two lines::

    x = images.float().div_(255).sub_(mean).div_(std)   # mean, std: (1, 3, 1, 1)

Lifetime, on the CPU (``device`` None or "cpu", or no CUDA): a tensor is a
view into the batch's slot of the ring, not a copy. It stays valid as long as
it lives: the slot goes back to the loader only once the tensor (and every
view of it) is gone. So drop it by the next step, or ``.clone()`` what you
keep: a rank has ``feed.info.slots_per_rank`` (K) slots, and K tensors kept
alive stop the ring (``AllSlotsHeldError``). The loop variable holds the
last tensor while the next one is taken: with K = 1, ``del`` it at the end
of the loop body.

On a CUDA device: the ring's payload region is pinned once
(``cudaHostRegister``, through ``torch.cuda.cudart()``), each batch is
copied with ``non_blocking=True`` on a side stream, up to ``prefetch``
batches ahead, and its slot goes back only once the copy's CUDA event has
completed. The tensors are the GPU's own; the consumer's current stream waits
for the copy before it uses one. The region is unregistered on ``close()``.
"""

import collections
import collections.abc
import logging
import weakref

import numpy as np
import torch
import torch.utils.data

from . import _resume
from . import errors
from ._feed import attach

__all__ = ["Loader", "STATE_VERSION", "TokenBatch"]

#: A batch of token windows with FlashAttention's varlen boundaries
#: (``Loader(cu_seqlens=True)``): ``tokens`` (B, L + 1), ``cu_seqlens`` int32
#: (documents + 1,) over the packed inputs ``tokens[:, :-1]``, and
#: ``max_seqlen``, the longest document piece (a Python int).
TokenBatch = collections.namedtuple("TokenBatch", ["tokens", "cu_seqlens", "max_seqlen"])

#: Version of the dict state_dict() returns; load_state_dict() reads it and older.
STATE_VERSION = 1
# Copies issued ahead of the one the loop gets, by default.
_PREFETCH_DEFAULT = 2
_PREFETCH_MAX = 64
# cudaErrorHostMemoryAlreadyRegistered: the region was pinned by someone else
# in this process (another Loader on the same feed, or the trainer itself).
_CUDA_ALREADY_REGISTERED = 712
_LOG = logging.getLogger("ringfeed")

# numpy views of the same item size that torch.from_numpy takes, for torch
# dtypes numpy has no equivalent of (bfloat16, float8, ...): the tensor is
# then viewed as the declared dtype, with no copy.
_INT_OF_SIZE = {1: np.int8, 2: np.int16, 4: np.int32, 8: np.int64}


def _resolve_dtype(dtype):
    """(torch dtype, numpy dtype of the view, whether the tensor is .view()ed)."""
    if dtype is None:
        return torch.uint8, np.dtype(np.uint8), False
    if isinstance(dtype, torch.dtype):
        target = dtype
    else:
        try:
            dt = np.dtype(dtype)
        except TypeError:
            raise errors.InvalidArgumentError("dtype must be a torch or numpy dtype, not %r" % (dtype,)) from None
        if not dt.isnative:
            raise errors.InvalidArgumentError(
                "dtype %s is not in this machine's byte order, and torch tensors are: declare %s and byte-swap "
                "after the copy" % (dt.str, dt.newbyteorder("=").str))
        try:
            target = torch.from_numpy(np.empty(0, dtype=dt)).dtype
        except TypeError:
            raise errors.InvalidArgumentError("dtype %s has no torch equivalent; declare a torch dtype" % dt) from None
    try:
        np_dtype = torch.empty(0, dtype=target).numpy().dtype
        return target, np.dtype(np_dtype), False
    except (TypeError, RuntimeError):
        size = torch.empty(0, dtype=target).element_size()
        if size not in _INT_OF_SIZE:
            raise errors.InvalidArgumentError("dtype %s (%d bytes an item) cannot view raw bytes" % (target, size)) from None
        return target, np.dtype(_INT_OF_SIZE[size]), True


def _resolve_shape(shape, what):
    if shape is None:
        return None
    if isinstance(shape, (int, np.integer)):
        shape = (shape,)
    try:
        shape = tuple(int(d) for d in shape)
    except (TypeError, ValueError):
        raise errors.InvalidArgumentError("%s must be a tuple of ints, not %r" % (what, shape)) from None
    if any(d < -1 for d in shape) or shape.count(-1) > 1:
        raise errors.InvalidArgumentError("invalid %s %r: dimensions must be >= 0, with at most one -1" % (what, shape))
    return shape


def _resolve_device(device):
    """A CUDA torch.device, or None for the CPU path."""
    if device is None:
        return None
    try:
        device = torch.device(device)
    except (TypeError, RuntimeError) as e:
        raise errors.InvalidArgumentError("device must be None, 'cpu' or a CUDA device, not %r (%s)" % (device, e)) from None
    if device.type == "cpu":
        return None
    if device.type != "cuda":
        raise errors.InvalidArgumentError(
            "device %s is not supported: ringfeed.torch copies to CUDA devices; use device='cuda' or None and "
            "move the tensors yourself" % device)
    if not torch.cuda.is_available():
        _LOG.warning("ringfeed: device %s asked for but CUDA is not available: the loader gives CPU tensors", device)
        return None
    if device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    return device


def _cuda_code(result):
    """The int of a cudaError that torch.cuda.cudart() returns."""
    return int(getattr(result, "value", result))


def _cuda_error_text(cudart, result):
    code = _cuda_code(result)
    try:
        return "%s (cudaError %d)" % (cudart.cudaGetErrorString(result), code)
    except Exception:  # noqa: BLE001 - only a better message is lost
        return "cudaError %d" % code


def _finish_gpu(waiting, ahead, stream, unpin):
    """The end of a CUDA Loader, by close() or when it is dropped: waits for
    the copies in flight and gives their slots back (never before), then
    unpins the ring. Refers to no Loader, so that it can be its finalizer;
    ``unpin`` holds the feed, so the ring stays mapped until then."""
    while waiting:
        entry = waiting.popleft()
        entry.event.synchronize()
        _release_entry(entry)
    ahead.clear()
    stream.synchronize()
    if unpin is not None:
        _unregister(*unpin)


def _release_entry(entry):
    """Gives the slot of ``entry`` back; its copy's event has completed."""
    entry.host = None  # the views of the slot
    entry.batch.release()
    entry.batch = None


def _unregister(cudart, device, address, feed):
    """Unpins the region, in the context that pinned it."""
    with torch.cuda.device(device):
        result = cudart.cudaHostUnregister(address)
    if _cuda_code(result) != 0:
        _LOG.warning("ringfeed: unpinning the ring of %r failed: %s", feed.name, _cuda_error_text(cudart, result))


class _InFlight:
    """One batch copied to the GPU, whose slot waits for its copy's event."""

    __slots__ = ("batch", "host", "out", "event", "epoch", "step", "indices", "resume_state")

    def __init__(self, batch, host, out, event):
        self.batch, self.host, self.out, self.event = batch, host, out, event
        self.epoch, self.step = batch.epoch, batch.step
        self.indices = batch.indices
        self.resume_state = batch.resume_state


class Loader(torch.utils.data.IterableDataset):
    """Iterates a ringfeed Feed as torch tensors, one epoch per loop, with
    torchdata's ``state_dict`` / ``load_state_dict``; ``len()`` is the steps
    of an epoch.

    ``feed``: an attached ``ringfeed.Feed``, or None to attach one
    (``ringfeed.attach()``: $RINGFEED_NAME, $LOCAL_RANK), which close()
    closes. ``dtype``, ``shape`` / ``batch_shape``, or ``collate``: what each
    batch becomes (see the module's doc). ``device``: None or "cpu" for
    zero-copy CPU tensors, or a CUDA device to copy each batch to, pinning
    the ring (``pin_memory``) and copying up to ``prefetch`` batches ahead
    (CUDA only). Use a Loader from one thread, and one Loader per feed.
    """

    def __init__(self, feed=None, *, dtype=None, shape=None, batch_shape=None, collate=None, device=None,
                 pin_memory=True, prefetch=_PREFETCH_DEFAULT, token_dtype=None, cu_seqlens=False):
        if collate is not None and (dtype is not None or shape is not None or batch_shape is not None):
            raise errors.InvalidArgumentError("pass either collate= or dtype=/shape=, not both: collate makes the batch itself")
        if collate is not None and not callable(collate):
            raise errors.InvalidArgumentError("collate must be a function of the batch's samples, not %r" % (collate,))
        if shape is not None and batch_shape is not None:
            raise errors.InvalidArgumentError("pass either shape= (one sample's) or batch_shape= (the whole batch's), not both")
        if isinstance(prefetch, bool) or not isinstance(prefetch, int) or not 1 <= prefetch <= _PREFETCH_MAX:
            raise errors.InvalidArgumentError("prefetch must be an int from 1 to %d, not %r" % (_PREFETCH_MAX, prefetch))
        self._dtype, self._np_dtype, self._view_as = _resolve_dtype(dtype)
        self._shape = _resolve_shape(shape, "shape")
        self._batch_shape = _resolve_shape(batch_shape, "batch_shape")
        self._collate = collate
        self._token_dtype = None if token_dtype is None else _resolve_dtype(token_dtype)[0]
        self._cu_seqlens = bool(cu_seqlens)
        self._device = _resolve_device(device)
        self._owns_feed = feed is None
        self._feed = attach() if feed is None else feed
        if (self._token_dtype is not None or self._cu_seqlens) and getattr(self._feed.info, "tokens", None) is None:
            if self._owns_feed:
                self._feed.close()
            raise errors.InvalidArgumentError(
                "token_dtype= and cu_seqlens= are for a loader of token windows (ringfeed serve --seq-len L); "
                "loader %r serves other samples" % (self._feed.name,))
        self._prefetch = prefetch
        self._started = False
        self._ended = False
        self._closed = False
        # CPU: the next batch, taken to see its epoch (_peek) and not yet
        # given to the loop.
        self._stash = None
        # (epoch, its steps) of the last epoch asked about (_epoch_steps).
        self._steps_of = (None, None)
        # The last batch the loop got was the last of its epoch.
        self._at_epoch_end = False
        # (epoch, step) epochs() last yielded at, and feed.taken then.
        self._epochs_at = None
        self._loaded = None  # the resume state load_state_dict() went to
        self.epoch = self.step = self.indices = self.resume_state = None
        # CUDA: copies the loop has not had yet, and every batch whose slot
        # waits for its copy (those the loop had included), oldest first.
        self._ahead = collections.deque()
        self._waiting = collections.deque()
        self._stream = None
        self._pinned = False
        if self._device is not None:
            self._stream = torch.cuda.Stream(self._device)
            unpin = self._pin() if pin_memory else None
            self._pinned = unpin is not None
            # Not at exit: the OS unpins and unmaps then, CUDA may be gone already.
            self._finish = weakref.finalize(self, _finish_gpu, self._waiting, self._ahead, self._stream, unpin)
            self._finish.atexit = False

    @property
    def feed(self):
        """The ringfeed.Feed this loader takes batches from."""
        return self._feed

    @property
    def device(self):
        """The CUDA device batches are copied to, or None (CPU tensors)."""
        return self._device

    @property
    def pinned(self):
        """True while this loader holds the ring's payload region pinned."""
        return self._pinned and self._finish.alive

    def _pin(self):
        """Pins the payload region; returns the arguments of its _unregister,
        or None when someone else in this process pinned it already."""
        info = self._feed.info
        address, nbytes = info.payload_region_address, info.payload_region_bytes
        if not address or not nbytes:
            raise errors.InvalidArgumentError(
                "loader %r gives no payload region to pin (address %#x, %d bytes): pass pin_memory=False"
                % (self._feed.name, address, nbytes))
        cudart = torch.cuda.cudart()
        with torch.cuda.device(self._device):
            result = cudart.cudaHostRegister(address, nbytes, 0)
        code = _cuda_code(result)
        if code == _CUDA_ALREADY_REGISTERED:
            _LOG.info("ringfeed: the ring of %r is pinned already in this process; copies use that", self._feed.name)
            return None
        if code != 0:
            raise errors.Error(
                "pinning the ring of loader %r (cudaHostRegister of %d bytes at %#x) failed: %s; pass "
                "pin_memory=False to copy from unpinned memory (slower)"
                % (self._feed.name, nbytes, address, _cuda_error_text(cudart, result)))
        return (cudart, self._device, address, self._feed)

    def __len__(self):
        """Steps (batches) of one epoch, the same for every rank: ``len(feed)``
        (``feed.info.steps_per_epoch``). The first epoch of a run resumed
        mid-epoch serves fewer: the rest of that epoch, as a DataLoader
        resumed with its state does (Lightning counts its steps the same
        way)."""
        return len(self._feed)

    def __bool__(self):
        # A loader is true, whatever its length.
        return True

    def __iter__(self):
        """One epoch: the batches of the next epoch this loader serves, from
        where the last loop stopped to the epoch's last step (nothing once the
        run is over)."""
        info = torch.utils.data.get_worker_info()
        if info is not None:
            raise errors.InvalidArgumentError(
                "ringfeed.torch.Loader iterated in DataLoader worker %d: the ring is attached in the main process, "
                "and the loader reads and batches already; pass num_workers=0 (and batch_size=None)" % info.id)
        return _Epoch(self)

    def epochs(self):
        """Yields the number of each epoch the loader still serves, before the
        loop over it: ``for epoch in loader.epochs(): for batch in loader:
        ...`` runs the whole run (``serve --epochs``), a resumed run from its
        checkpoint's epoch. Ends when the run does. Each yield waits for the
        epoch's first batch (it takes it, to see its epoch)."""
        while True:
            at = self._peek()
            if at is None:
                return
            taken = (self.epoch, self.step)  # what the loop had so far
            if self._epochs_at == (at, taken):
                raise errors.InvalidArgumentError(
                    "loader.epochs() went on with no batch taken since its last epoch (%d): iterate the loader in "
                    "the loop's body (for batch in loader: ...)" % at[0])
            self._epochs_at = (at, taken)
            yield at[0]

    def __next__(self):
        """The next batch, whatever its epoch (``for`` loops one epoch)."""
        if self._device is None:
            return self._next_on_cpu()
        return self._next_on_gpu()

    def _take(self):
        """The feed's next batch, or None at the end of the run."""
        if self._closed:
            raise ValueError("this loader of feed %r is closed" % self._feed.name)
        if self._stash is not None:
            batch, self._stash = self._stash, None
            return batch
        if self._ended:
            return None
        if self._feed.closed:
            raise ValueError("the feed %r of this loader is closed: attach again (ringfeed.attach)" % self._feed.name)
        self._started = True
        batch = self._feed.next()
        if batch is None:
            self._ended = True
        return batch

    def _peek(self):
        """``(epoch, step)`` of the batch the loop gets next, taking it from
        the feed if need be (kept for the loop); None at the end of the run."""
        if self._device is None:
            if self._stash is None:
                self._stash = self._take()
            return None if self._stash is None else (self._stash.epoch, self._stash.step)
        self._fill_ahead()
        if not self._ahead:
            self._drain()  # the run is over: every slot back, as at __next__'s end
            return None
        return (self._ahead[0].epoch, self._ahead[0].step)

    def _epoch_steps(self, epoch):
        """Steps of ``epoch`` (the feed's rule), or None if unknown."""
        if self._steps_of[0] != epoch or self._steps_of[1] is None:
            self._steps_of = (epoch, self._feed.steps_in_epoch(epoch))
        return self._steps_of[1]

    def _next_on_cpu(self):
        batch = self._take()
        if batch is None:
            raise StopIteration
        with batch:  # the slot goes back when the tensors made here are gone
            out = self._make(batch)
            self._delivered(batch.epoch, batch.step, batch.indices, batch.resume_state)
        return out

    def _next_on_gpu(self):
        self._fill_ahead()
        if not self._ahead:
            self._drain()
            raise StopIteration
        entry = self._ahead.popleft()
        consumer = torch.cuda.current_stream(self._device)
        consumer.wait_event(entry.event)
        # The copies were made on the side stream: the caching allocator must
        # not hand their memory out again while the consumer's stream uses it.
        _each_tensor(entry.out, lambda t: t.record_stream(consumer))
        self._delivered(entry.epoch, entry.step, entry.indices, entry.resume_state)
        out, entry.out = entry.out, None
        return out

    def _fill_ahead(self):
        """Gives back the slots whose copies ended, and starts copies up to
        ``prefetch`` batches ahead of the loop."""
        self._reap()
        while len(self._ahead) < self._prefetch and not self._ended:
            self._make_room()
            batch = self._take()
            if batch is None:
                break
            try:
                self._ahead.append(self._copy(batch))
            except BaseException:
                # A copy of part of it may have started (a collate's second
                # tensor failing): the slot goes back once that one ended.
                self._stream.synchronize()
                batch.release()
                raise

    def _delivered(self, epoch, step, indices, resume_state):
        self.epoch, self.step, self.indices, self.resume_state = epoch, step, indices, resume_state
        steps = self._epoch_steps(epoch)
        self._at_epoch_end = steps is not None and step + 1 >= steps

    def _make(self, batch):
        """The batch as the loop gets it on the CPU: zero-copy views."""
        if batch._images is not None and self._collate is None and self._shape is None and self._batch_shape is None:
            # Decoded images: their shape is the loader's, said in the ring.
            return (torch.from_numpy(batch.images), torch.from_numpy(batch.labels))
        if batch._tokens is not None and self._collate is None and self._shape is None and self._batch_shape is None:
            return self._tokens_of(batch)
        if self._collate is not None:
            # One vectorised pass over the sample table (batch.samples), not a
            # Python call per sample: microseconds for 64 small samples.
            return self._collate(batch.samples(numpy=True))
        if self._batch_shape is not None:
            shape = self._batch_shape
        elif self._shape is not None:
            shape = (len(batch),) + self._shape
            if not len(batch):
                # An empty batch (the last step of a kept tail): nothing to
                # infer a -1 from.
                shape = tuple(0 if d == -1 else d for d in shape)
        else:
            shape = None
        try:
            array = batch.array(self._np_dtype, shape)
        except ValueError as e:
            misfit = self._misfit(batch, e)
        else:
            tensor = torch.from_numpy(array)
            return tensor.view(self._dtype) if self._view_as else tensor
        # Raised out of the except block: the error would keep the frame of
        # batch.array(), and the slot with it, as its __context__.
        raise ValueError(misfit)

    def _tokens_of(self, batch):
        """A token batch on the CPU: the windows (a zero-copy view, unless a
        token_dtype on the CPU asks for a converted copy) and, asked for,
        their varlen boundaries."""
        tokens = torch.from_numpy(batch.tokens)
        if self._token_dtype is not None and self._device is None:
            tokens = tokens.to(self._token_dtype)
        if not self._cu_seqlens:
            return tokens
        cu = batch.cu_seqlens()
        return TokenBatch(tokens, torch.from_numpy(cu), int(np.diff(cu).max()) if len(cu) > 1 else 0)

    def _misfit(self, batch, error):
        lengths = batch.lengths
        per_sample = "%d bytes" % lengths[0] if len(lengths) and (lengths == lengths[0]).all() else "unequal sizes"
        declared = "batch_shape=%r" % (self._batch_shape,) if self._batch_shape is not None else "shape=%r" % (self._shape,)
        fix = "declare the shape of one sample with shape=, of the whole batch with batch_shape=, or pass collate="
        if per_sample != "unequal sizes" and len(lengths) and int(lengths[0]) % self._np_dtype.itemsize == 0:
            fix = "e.g. shape=(%d,) for one sample; or pass collate=" % (int(lengths[0]) // self._np_dtype.itemsize)
        elif per_sample == "unequal sizes":
            fix = "pass collate= to batch samples of different sizes"
        return "dtype=%s %s does not fit batch epoch %d step %d (%d samples of %s): %s; %s" % (
            self._dtype, declared, batch.epoch, batch.step, len(batch), per_sample, error, fix)

    def _copy(self, batch):
        """Starts the copy of ``batch`` to the device on the side stream."""
        host = self._make(batch)
        with torch.cuda.stream(self._stream):
            out = _map_tensors(host, lambda t: t.to(self._device, non_blocking=True))
            if self._token_dtype is not None and batch._tokens is not None:
                # Converted on the device: the copy moves the corpus's dtype.
                if isinstance(out, TokenBatch):
                    out = out._replace(tokens=out.tokens.to(self._token_dtype))
                elif isinstance(out, torch.Tensor):
                    out = out.to(self._token_dtype)
            event = torch.cuda.Event()
            event.record(self._stream)
        entry = _InFlight(batch, host, out, event)
        self._waiting.append(entry)
        return entry

    def _release(self, entry):
        """Gives the slot of ``entry`` back; its copy's event has completed."""
        _release_entry(entry)

    def _reap(self):
        """Gives back the slots whose copies have completed."""
        for entry in list(self._waiting):
            if entry.event.query():
                self._waiting.remove(entry)
                self._release(entry)

    def _make_room(self):
        """Waits for the oldest copy while this loader holds every slot of
        the rank: the next batch needs one of them."""
        while self._waiting and len(self._waiting) >= self._feed.info.slots_per_rank:
            entry = self._waiting.popleft()
            entry.event.synchronize()
            self._release(entry)

    def _drain(self):
        """Waits for every copy and gives back every slot."""
        while self._waiting:
            entry = self._waiting.popleft()
            entry.event.synchronize()
            self._release(entry)
        self._ahead.clear()

    def state_dict(self):
        """Where the data stands, to save in a checkpoint after a step:
        ``{"version", "resume_state", "order", "epoch", "step"}``, plain ints
        and lists. ``resume_state`` is the last batch's
        ``Batch.resume_state`` (the state once every rank trained on its
        step); before the first batch, where this loader starts."""
        if self.epoch is not None:
            resume_state = self.resume_state
        elif self._loaded is not None:
            resume_state = self._loaded
        else:
            resume_state = self._start_state()
        order = self._feed.order
        return {
            "version": STATE_VERSION,
            "resume_state": None if resume_state is None else [int(resume_state[0]), int(resume_state[1])],
            "order": None if order is None else [int(order[0]), int(order[1]), bool(order[2])],
            "epoch": self.epoch,
            "step": self.step,
        }

    def _start_state(self):
        info = self._feed.info
        if info.start is None or info.dataset_samples is None:
            return None
        job_world_size = info.job_world_size if info.job_world_size is not None else info.world_size
        per_step = job_world_size * info.max_samples_per_slot
        # Batches taken to look at their epoch (epochs()) are not the loop's yet.
        taken = (self._feed.taken or 0) - (self._stash is not None) - len(self._ahead)
        return _resume.advance(info.start, taken, info.dataset_samples, per_step, _resume.tail_of(info))

    def load_state_dict(self, state):
        """Goes on from ``state`` (a ``state_dict()``), before the first
        batch: the loader is asked to start there (``Feed.request_start``),
        or, with a loader that cannot be asked, is checked to start there
        (``ringfeed.check_resume``). Raises ``ResumeMismatchError`` naming
        the fix when the loader cannot go there or serves another order."""
        if self._started:
            raise errors.InvalidArgumentError(
                "load_state_dict() after the first batch: call it before iterating (a resumed loop starts from "
                "the state), on a new Loader")
        resume_state, order = _check_state(state)
        request_start = getattr(self._feed, "request_start", None)
        if request_start is not None:
            request_start(resume_state[0], resume_state[1], order)
        else:
            _resume.check_resume(self._feed, resume_state, order)
        self._loaded = resume_state

    def close(self):
        """Waits for the copies in flight, gives their slots back, unpins the
        ring and, if this loader attached the feed, closes it. The CPU
        tensors given out stay valid. Batches copied ahead that the loop did
        not get (at most ``prefetch``) are dropped: ``state_dict()`` is that
        of the last batch the loop got. A second call does nothing."""
        self._close(warn=True)

    def _close(self, warn):
        if warn and not self._closed and self._at_epoch_end and not self._ended:
            self._warn_of_epochs_left()
        self._closed = True
        if self._stash is not None:
            self._stash.release()
            self._stash = None
        if self._device is not None:
            self._drain()
            self._finish()
        if self._owns_feed:
            self._feed.close()

    def _warn_of_epochs_left(self):
        """Closed at an epoch's end with more to come: a loop written for a
        Loader that iterated the whole run trains one epoch now; say so."""
        feed = self._feed
        try:
            left = feed.info.batches_expected - feed.taken if feed.info.batches_expected is not None else None
        except (ValueError, errors.Error):
            return
        if left:
            _LOG.warning(
                "ringfeed: loader %r closed after epoch %d with %d batch(es) of the run left for rank %d: a "
                "`for batch in loader` loop is one epoch, as a DataLoader's; `for epoch in loader.epochs(): for "
                "batch in loader: ...` takes every epoch", feed.name, self.epoch, left, feed.rank)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self._close(warn=exc[0] is None)  # a loop left by an exception says nothing more
        return False

    def __repr__(self):
        where = "cpu" if self._device is None else "%s%s" % (self._device, " pinned" if self.pinned else "")
        return "<ringfeed.torch.Loader feed=%r %s epoch=%s step=%s>" % (self._feed.name, where, self.epoch, self.step)


class _Epoch:
    """One epoch of a Loader, what ``iter(loader)`` gives: its batches from
    where the last loop stopped to the epoch's last step. Takes nothing until
    its first ``next``."""

    __slots__ = ("_loader", "_epoch", "_over")

    def __init__(self, loader):
        self._loader, self._epoch, self._over = loader, None, False

    def __iter__(self):
        return self

    def __len__(self):
        return len(self._loader)

    def __next__(self):
        loader = self._loader
        if self._over:
            raise StopIteration
        if self._epoch is None and loader._at_epoch_end:
            loader._at_epoch_end = False  # a new loop: the next epoch
        elif loader._at_epoch_end:
            self._over = True
            raise StopIteration
        at = loader._peek()
        if at is None or (self._epoch is not None and at[0] != self._epoch):
            # The run is over, or the next batch is another epoch's (a loader
            # whose epoch length is not known): it waits for the next loop.
            self._over = True
            raise StopIteration
        self._epoch = at[0]
        return next(loader)


def _check_state(state):
    """(resume_state, order) of a state_dict(), or InvalidArgumentError."""
    if not isinstance(state, collections.abc.Mapping):
        raise errors.InvalidArgumentError("state must be a dict from Loader.state_dict(), not %s" % type(state).__name__)
    version = state.get("version")
    if isinstance(version, bool) or not isinstance(version, int) or version < 1:
        raise errors.InvalidArgumentError("state has no valid 'version' (%r): it is not a Loader.state_dict()" % (version,))
    if version > STATE_VERSION:
        raise errors.InvalidArgumentError(
            "state version %d is newer than this ringfeed reads (%d): upgrade ringfeed to resume from it"
            % (version, STATE_VERSION))
    for key in ("resume_state", "order"):
        if key not in state:
            raise errors.InvalidArgumentError("state has no %r: it is not a Loader.state_dict()" % key)
    if state["resume_state"] is None:
        raise errors.InvalidArgumentError(
            "state holds no resume state: it was saved with a loader too old to say where it was; resume with "
            "`ringfeed serve --resume EPOCH:SAMPLES` and ringfeed.check_resume instead")
    resume_state = _resume.two_counts(state["resume_state"], "state['resume_state']", "(epoch, samples)")
    order = state["order"]
    if order is not None:
        try:
            n, seed, shuffled, *block = order
            if len(block) not in (0, 2):
                raise ValueError(block)
            order = (int(n), int(seed), bool(shuffled)) + tuple(int(v) for v in block)
        except (TypeError, ValueError):
            raise errors.InvalidArgumentError(
                "state['order'] must be (dataset_samples, seed, shuffled), or with --shuffle block "
                "(dataset_samples, seed, shuffled, block_samples, window_blocks), not %r" % (order,)) from None
    return resume_state, order


def _map_tensors(obj, fn):
    """``obj`` with ``fn`` applied to every tensor (and numpy array) in it,
    through dicts, lists and tuples."""
    if isinstance(obj, torch.Tensor):
        return fn(obj)
    if isinstance(obj, np.ndarray):
        return fn(torch.from_numpy(obj))
    if isinstance(obj, collections.abc.Mapping):
        return {k: _map_tensors(v, fn) for k, v in obj.items()}
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):
        return type(obj)(*(_map_tensors(v, fn) for v in obj))
    if isinstance(obj, (list, tuple)):
        return type(obj)(_map_tensors(v, fn) for v in obj)
    return obj


def _each_tensor(obj, fn):
    _map_tensors(obj, lambda t: fn(t) or t)
