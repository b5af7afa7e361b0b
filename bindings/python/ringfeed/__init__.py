"""ringfeed: read training batches from the node's loader, without copying.

One ``ringfeed serve`` process per machine writes batches into a shared-memory
ring; each training process (one per GPU under torchrun) attaches to its rank
and reads its batches in place::

    import ringfeed, torch

    feed = ringfeed.attach()            # name from RINGFEED_NAME, rank from LOCAL_RANK
    for batch in feed:                  # every epoch, until the loader is done
        batch.epoch, batch.step         # ints
        batch.indices                   # numpy uint64, one manifest index per sample
        batch.sample(i)                 # zero-copy memoryview of sample i
        batch.samples()                 # all of them at once (microseconds for 64 small ones)
        x = torch.from_numpy(batch.array("uint16", (B, L)))   # zero-copy
        x = x.cuda(non_blocking=False)  # copy out of the ring ...
        batch.release()                 # ... then give the slot back

For torch, ``ringfeed.torch.Loader`` (the one module that imports torch)
gives each batch as a tensor, on the CPU without a copy or on a GPU through
the pinned ring, with torchdata's ``state_dict`` / ``load_state_dict``.
For WebDataset tar shards (``ringfeed serve --format tar``), ``ringfeed.tar``
reads a sample's fields in place (``batch.fields(i)`` on a batch).

Lifetime of views (the one rule to know)
----------------------------------------
Views (``sample()``, ``buffer()``, ``array()`` and every numpy array or torch
tensor made from them) point straight into the loader's shared memory. A slot
is given back to the loader exactly once, when the batch was released
(``batch.release()``, leaving ``with batch:``, or dropping the Batch) **and**
the last view of it is gone. So:

- ``release()`` defers while views are alive; it never leaves a dangling
  view. ``batch.released`` says whether the slot was given back. Releasing
  twice does nothing.
- A view that you keep keeps its slot. A rank's batches take its
  ``slots_per_rank`` (K) slots in turn, so a batch held (or a view of it kept)
  stops the rank K batches after it: ``next()`` then raises
  ``AllSlotsHeldError`` at once, naming the batch, rather than waiting for
  something that cannot happen (a view that dies on another thread meanwhile
  is given back first). Copy what you need to keep (``.copy()``, ``.cuda()``),
  then drop the views.
- The iterator does not release the previous batch for you. Rebinding the loop
  variable drops it, as long as no view of it survives.
- ``feed.close()`` (or leaving ``with feed:``) stops the feed; the ring stays
  mapped until the last batch and view are gone, then the rank is detached.
- ``batch.data_ptr`` and ``feed.info.payload_region_address`` are raw
  addresses (for ``cudaHostRegister``/DMA); they carry no lifetime: keep a view
  alive while you use them.

Views are writable: the slot belongs to this process until it is given back.

Threads: use a Feed from one thread. Views may die on any thread; a slot freed
while that thread is inside ``next()`` is given back within 150 ms. The C calls
release the GIL, so a blocking ``next()`` or ``attach()`` does not stall other
threads, and Ctrl-C interrupts it. A batch that ``next()`` took just as Ctrl-C
arrived is what the following ``next()`` returns, so an interrupted loop can go
on where it stopped, and no slot is left taken but out of reach.

Fork: a Feed belongs to the process that attached it. In a forked child (a
fork-based DataLoader worker, ``multiprocessing`` with ``fork``) ``next()``
raises ``ForkedError`` and the child's copies of the feed and its batches give
nothing back when they die, so the parent's batches stay whole. Attach in the
child itself if it needs batches.

Errors are ``ringfeed.Error`` (a RuntimeError), one subclass per cause:
``LoaderGoneError``, ``AbortedError``, ``CorruptSegmentError``,
``VersionMismatchError``, ``RankError`` (also ValueError), ``RankBusyError``,
``StaleBatchError``, ``InvalidArgumentError`` (also ValueError),
``IOFailureError``, ``InternalError``, ``AllSlotsHeldError``, ``ForkedError``,
``UntrustedLoaderError`` and ``FeedTimeoutError`` (also the builtin TimeoutError; its old
name ``ringfeed.TimeoutError`` stays for a release, outside ``__all__``). The message is the
library's, and says what to do. ``check_resume`` raises
``ResumeMismatchError`` (also ValueError).

``RINGFEED_LIB`` overrides the path of ``libringfeed.so`` (the package ships
its own).
"""

from . import _version, errors, tar
from ._batch import Batch
from ._feed import Feed, FeedInfo, ImageFormat, abi_version, attach
from ._job import check_same_plan
from ._lib import LIB as _LIB
from ._progress import Progress
from ._resume import check_resume
from .errors import (
    AbortedError,
    AllSlotsHeldError,
    CorruptSegmentError,
    Error,
    FeedTimeoutError,
    ForkedError,
    InternalError,
    InvalidArgumentError,
    IOFailureError,
    LoaderGoneError,
    RankBusyError,
    RankError,
    ResumeMismatchError,
    StaleBatchError,
    UntrustedLoaderError,
    VersionMismatchError,
)

__version__ = _version.__version__

#: Path the C library was loaded from.
library_path = _LIB.path

# Old names kept for a release, outside __all__ (``import *`` leaves the
# builtin TimeoutError alone): FeedTimeoutError's, and the tar helpers'
# before ``ringfeed.tar``.
TimeoutError = errors.TimeoutError
TarFieldError = tar.FieldError
tar_fields = tar.fields
tar_key = tar.key
tar_members = tar.members

__all__ = [
    "AbortedError",
    "AllSlotsHeldError",
    "Batch",
    "CorruptSegmentError",
    "Error",
    "FeedTimeoutError",
    "ForkedError",
    "Feed",
    "FeedInfo",
    "ImageFormat",
    "IOFailureError",
    "InternalError",
    "InvalidArgumentError",
    "LoaderGoneError",
    "Progress",
    "RankBusyError",
    "RankError",
    "ResumeMismatchError",
    "StaleBatchError",
    "UntrustedLoaderError",
    "VersionMismatchError",
    "abi_version",
    "attach",
    "check_resume",
    "check_same_plan",
    "library_path",
]
