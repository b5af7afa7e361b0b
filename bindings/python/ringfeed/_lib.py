"""The C ABI of ``libringfeed.so`` in ctypes: loading, structs, prototypes,
and ``LIB``, the one handle the rest of the package calls the library through.

Mirrors ``ffi/src/lib.rs`` (the source of truth) and ``include/ringfeed.h``.
Nothing here has logic of its own; ``_handle.py``, ``_batch.py`` and
``_feed.py`` build the Python API on it. The package's modules depend on
this file's names without a leading underscore (the return codes, the
structs, ``Library`` and ``LIB``), never on its private ones.
"""

import ctypes
import os

# Return codes (ffi/src/lib.rs).
RF_OK = 0
RF_END = 1
RF_TIMEOUT = 2
RF_E_INVALID = -1
RF_E_CORRUPT = -2
RF_E_VERSION = -3
RF_E_RANK = -4
RF_E_BUSY = -5
RF_E_LOADER_GONE = -6
RF_E_ABORTED = -7
RF_E_STALE = -8
RF_E_IO = -9
RF_E_INTERNAL = -10
RF_E_HELD = -11
RF_E_FORKED = -12
RF_E_UNTRUSTED = -13
RF_START_FIXED = 0
RF_START_AWAITING = 1
RF_START_DECIDED = 2
# How every epoch ends (rf_get_epoch's tail; ffi/src/epoch.rs).
RF_TAIL_DROP = 0
RF_TAIL_KEEP = 1
# FeedInfo.tail's words for them.
TAIL_NAMES = {RF_TAIL_DROP: "drop", RF_TAIL_KEEP: "keep"}

# Sentinel of rf_info.batches_expected: the loader did not say.
BATCHES_UNKNOWN = 2**64 - 1

LIBRARY_NAME = "libringfeed.so"
# Environment variable that overrides where the library is loaded from.
LIBRARY_ENV = "RINGFEED_LIB"


class rf_image_format(ctypes.Structure):
    """The shape of a loader's decoded images (``serve --decode image``)."""

    _fields_ = [
        ("is_image", ctypes.c_uint32),
        ("height", ctypes.c_uint32),
        ("width", ctypes.c_uint32),
        ("chw", ctypes.c_uint32),
        ("classes", ctypes.c_uint32),
        ("reserved", ctypes.c_uint32),
        ("labels_offset", ctypes.c_uint64),
        ("bad_offset", ctypes.c_uint64),
    ]


class rf_token_format(ctypes.Structure):
    """The token layout of a loader's batches (``serve --seq-len``)."""

    _fields_ = [
        ("is_tokens", ctypes.c_uint32),
        ("item_bytes", ctypes.c_uint32),
        ("dtype", ctypes.c_char * 8),
        ("seq_len", ctypes.c_uint64),
        ("doc_counts_offset", ctypes.c_uint64),
        ("doc_starts_offset", ctypes.c_uint64),
        ("doc_starts_max", ctypes.c_uint32),
        ("has_eos", ctypes.c_uint32),
        ("eos_token", ctypes.c_uint64),
        ("corpora", ctypes.c_uint32),
        ("reserved", ctypes.c_uint32),
    ]


class rf_sample(ctypes.Structure):
    """One sample of a batch: its bytes are ``data + offset .. + len``."""

    _fields_ = [
        ("offset", ctypes.c_uint64),
        ("len", ctypes.c_uint64),
        ("index", ctypes.c_uint64),
    ]


class rf_batch(ctypes.Structure):
    """A batch taken by rf_next: views into the ring until rf_release."""

    _fields_ = [
        ("data", ctypes.c_void_p),
        ("samples", ctypes.c_void_p),  # const rf_sample*
        ("n_samples", ctypes.c_uint32),
        ("slot", ctypes.c_uint32),
        ("epoch", ctypes.c_uint64),
        ("step", ctypes.c_uint64),
        ("generation", ctypes.c_uint64),
        ("data_len", ctypes.c_uint64),
    ]


class rf_info(ctypes.Structure):
    """Shape of the ring a feed is attached to."""

    _fields_ = [
        ("world_size", ctypes.c_uint32),
        ("rank", ctypes.c_uint32),
        ("slots_per_rank", ctypes.c_uint32),
        ("max_samples_per_slot", ctypes.c_uint32),
        ("slot_payload_bytes", ctypes.c_uint64),
        ("payload_region", ctypes.c_void_p),
        ("payload_region_bytes", ctypes.c_uint64),
        ("batches_expected", ctypes.c_uint64),
    ]


class rf_key(ctypes.Structure):
    """A sample's key (rf_batch_key): a view of the slot, until release."""

    _fields_ = [
        ("key", ctypes.c_void_p),
        ("len", ctypes.c_uint64),
        ("record", ctypes.c_uint64),
        ("cut", ctypes.c_uint32),
        ("reserved", ctypes.c_uint32),
    ]


# rf_key.record of a sample that is not a record.
NOT_A_RECORD = 2**64 - 1


class rf_job(ctypes.Structure):
    """Where a feed's ranks sit in the training job (rf_get_job)."""

    _fields_ = [
        ("first_rank", ctypes.c_uint32),
        ("job_world_size", ctypes.c_uint32),
        ("plan_digest", ctypes.c_uint64),
    ]


class rf_epoch(ctypes.Structure):
    """How every epoch of a feed's loader ends, and its size (rf_get_epoch)."""

    _fields_ = [
        ("tail", ctypes.c_uint32),
        ("reserved", ctypes.c_uint32),
        ("steps_per_epoch", ctypes.c_uint64),
        ("samples_per_epoch", ctypes.c_uint64),
        ("dataset_samples", ctypes.c_uint64),
    ]


class rf_run_shape(ctypes.Structure):
    """The shape of the loader's run (rf_get_run_shape), for progress."""

    _fields_ = [
        ("epochs", ctypes.c_uint64),
        ("epoch_steps", ctypes.c_uint64),
        ("batch_size", ctypes.c_uint64),
    ]


# The sizes the Rust side has; a mismatch means this file drifted from the ABI.
for _struct, _size in ((rf_sample, 24), (rf_batch, 56), (rf_info, 48), (rf_job, 16), (rf_key, 32), (rf_epoch, 32),
                      (rf_run_shape, 24), (rf_token_format, 64)):
    if ctypes.sizeof(_struct) != _size:
        raise ImportError(
            "ringfeed: ctypes struct %s is %d bytes, the C ABI says %d"
            % (_struct.__name__, ctypes.sizeof(_struct), _size)
        )
del _struct, _size

_feed_p = ctypes.c_void_p  # rf_feed* (opaque)


def bundled_path():
    """Path of the library shipped inside the package."""
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), LIBRARY_NAME)


def library_path():
    """Path the library is loaded from: $RINGFEED_LIB, else the bundled one."""
    return os.environ.get(LIBRARY_ENV) or bundled_path()


# The functions of the first library: every library has them.
_REQUIRED = ("rf_attach", "rf_next", "rf_release", "rf_get_info", "rf_detach", "rf_last_error", "rf_abi_version")
# Newer ones: None on a Library whose file lacks them (an older RINGFEED_LIB).
_OPTIONAL = (
    "rf_get_job", "rf_resume_state", "rf_get_taken", "rf_get_start", "rf_resume_normal", "rf_resume_after",
    "rf_resume_advance", "rf_request_start", "rf_get_start_mode", "rf_get_order", "rf_get_order_block",
    "rf_get_image_format", "rf_batch_key", "rf_get_class_count", "rf_get_class_name", "rf_get_epoch",
    "rf_epoch_steps", "rf_resume_normal_tail", "rf_resume_after_tail", "rf_resume_advance_tail",
    "rf_get_run_shape", "rf_get_token_format",
)


def _declare(lib):
    """Declares argtypes and restype of every function we call."""
    lib.rf_attach.argtypes = [ctypes.c_char_p, ctypes.c_int32, ctypes.c_int64, ctypes.POINTER(_feed_p)]
    lib.rf_attach.restype = ctypes.c_int
    lib.rf_next.argtypes = [_feed_p, ctypes.POINTER(rf_batch), ctypes.c_int64]
    lib.rf_next.restype = ctypes.c_int
    lib.rf_release.argtypes = [_feed_p, ctypes.POINTER(rf_batch)]
    lib.rf_release.restype = ctypes.c_int
    lib.rf_get_info.argtypes = [_feed_p, ctypes.POINTER(rf_info)]
    lib.rf_get_info.restype = ctypes.c_int
    lib.rf_detach.argtypes = [_feed_p]
    lib.rf_detach.restype = None
    lib.rf_last_error.argtypes = []
    lib.rf_last_error.restype = ctypes.c_char_p
    lib.rf_abi_version.argtypes = []
    lib.rf_abi_version.restype = ctypes.c_uint32
    # Newer than the first library: a RINGFEED_LIB from before it lacks it,
    # and feeds then report a job that is all on one machine.
    if hasattr(lib, "rf_get_job"):
        lib.rf_get_job.argtypes = [_feed_p, ctypes.POINTER(rf_job)]
        lib.rf_get_job.restype = ctypes.c_int
    if hasattr(lib, "rf_resume_state"):
        u64_p = ctypes.POINTER(ctypes.c_uint64)
        lib.rf_resume_state.argtypes = [_feed_p, ctypes.POINTER(rf_batch), u64_p, u64_p]
        lib.rf_resume_state.restype = ctypes.c_int
    if hasattr(lib, "rf_get_taken"):
        lib.rf_get_taken.argtypes = [_feed_p, ctypes.POINTER(ctypes.c_uint64)]
        lib.rf_get_taken.restype = ctypes.c_int
    if hasattr(lib, "rf_get_start"):
        lib.rf_get_start.argtypes = [_feed_p] + [ctypes.POINTER(ctypes.c_uint64)] * 3
        lib.rf_get_start.restype = ctypes.c_int
    for name, arity in (("rf_resume_normal", 4), ("rf_resume_after", 5), ("rf_resume_advance", 5)):
        # The resume rule (ring::resume in the engine), so that the binding
        # never keeps a copy of it that could drift.
        if hasattr(lib, name):
            fn = getattr(lib, name)
            fn.argtypes = [ctypes.c_uint64] * arity + [ctypes.POINTER(ctypes.c_uint64)] * 2
            fn.restype = ctypes.c_int
        # The same rule under a tail (--tail keep), its last argument.
        if hasattr(lib, name + "_tail"):
            fn = getattr(lib, name + "_tail")
            fn.argtypes = [ctypes.c_uint64] * arity + [ctypes.c_uint32] + [ctypes.POINTER(ctypes.c_uint64)] * 2
            fn.restype = ctypes.c_int
    if hasattr(lib, "rf_get_epoch"):
        lib.rf_get_epoch.argtypes = [_feed_p, ctypes.POINTER(rf_epoch)]
        lib.rf_get_epoch.restype = ctypes.c_int
    if hasattr(lib, "rf_epoch_steps"):
        lib.rf_epoch_steps.argtypes = [ctypes.c_uint64] * 3 + [ctypes.c_uint32, ctypes.POINTER(ctypes.c_uint64)]
        lib.rf_epoch_steps.restype = ctypes.c_int
    if hasattr(lib, "rf_request_start"):
        lib.rf_get_start_mode.argtypes = [_feed_p, ctypes.POINTER(ctypes.c_uint32)]
        lib.rf_get_start_mode.restype = ctypes.c_int
        lib.rf_request_start.argtypes = [_feed_p, ctypes.c_int32, ctypes.c_uint64, ctypes.c_uint64]
        lib.rf_request_start.restype = ctypes.c_int
    if hasattr(lib, "rf_get_order"):
        lib.rf_get_order.argtypes = [_feed_p, ctypes.POINTER(ctypes.c_uint64), ctypes.POINTER(ctypes.c_uint32)]
        lib.rf_get_order.restype = ctypes.c_int
    if hasattr(lib, "rf_get_image_format"):
        lib.rf_get_image_format.argtypes = [_feed_p, ctypes.POINTER(rf_image_format)]
        lib.rf_get_image_format.restype = ctypes.c_int
    if hasattr(lib, "rf_batch_key"):
        lib.rf_batch_key.argtypes = [_feed_p, ctypes.POINTER(rf_batch), ctypes.c_uint32, ctypes.POINTER(rf_key)]
        lib.rf_batch_key.restype = ctypes.c_int
    if hasattr(lib, "rf_get_class_name"):
        lib.rf_get_class_count.argtypes = [_feed_p, ctypes.POINTER(ctypes.c_uint32)]
        lib.rf_get_class_count.restype = ctypes.c_int
        lib.rf_get_class_name.argtypes = [_feed_p, ctypes.c_uint32, ctypes.POINTER(ctypes.c_void_p),
                                          ctypes.POINTER(ctypes.c_uint64)]
        lib.rf_get_class_name.restype = ctypes.c_int
    if hasattr(lib, "rf_get_run_shape"):
        lib.rf_get_run_shape.argtypes = [_feed_p, ctypes.POINTER(rf_run_shape)]
        lib.rf_get_run_shape.restype = ctypes.c_int
    if hasattr(lib, "rf_get_token_format"):
        lib.rf_get_token_format.argtypes = [_feed_p, ctypes.POINTER(rf_token_format)]
        lib.rf_get_token_format.restype = ctypes.c_int
    if hasattr(lib, "rf_get_order_block"):
        lib.rf_get_order_block.argtypes = [_feed_p, ctypes.POINTER(ctypes.c_uint32), ctypes.POINTER(ctypes.c_uint32)]
        lib.rf_get_order_block.restype = ctypes.c_int


def load():
    """Loads and declares the library (a ``Library``), or raises ImportError saying where it looked."""
    path = library_path()
    if not os.path.exists(path):
        hint = (
            "set %s to a libringfeed.so (cargo build --release -p ringfeed-ffi "
            "makes target/release/libringfeed.so), or reinstall the package" % LIBRARY_ENV
        )
        raise ImportError("ringfeed: the C library %s does not exist; %s" % (path, hint))
    try:
        # ctypes.CDLL releases the GIL during every call, so a blocking rf_next
        # does not stop other Python threads.
        cdll = ctypes.CDLL(path)
        _declare(cdll)
        return Library(cdll, path)
    except (OSError, AttributeError) as e:
        raise ImportError("ringfeed: cannot load the C library %s: %s" % (path, e)) from e


class Library:
    """The loaded ``libringfeed.so``: the package's one handle on it.

    Its ``rf_*`` attributes are the C functions, prototypes declared; one
    newer than the first library is None when the loaded file lacks it
    (``has(name)`` says). The methods are the calls every module makes the
    same way. ``path`` is the file it was loaded from.
    """

    def __init__(self, cdll, path):
        self.path = path
        for name in _REQUIRED:
            setattr(self, name, getattr(cdll, name))
        for name in _OPTIONAL:
            setattr(self, name, getattr(cdll, name, None))
        if self.rf_request_start is None:
            # Declared (and used) only beside rf_request_start, see _declare.
            self.rf_get_start_mode = None

    def __repr__(self):
        return "<ringfeed library %s>" % self.path

    def has(self, name):
        """True when the loaded library has the C function ``name``."""
        return name.startswith("rf_") and getattr(self, name, None) is not None

    def last_error(self):
        """rf_last_error() as text; call it right after the failing call, same thread."""
        raw = self.rf_last_error()
        return raw.decode("utf-8", "replace") if raw else ""

    def resume_rule(self, name, *args, tail=RF_TAIL_DROP):
        """Calls the library's resume rule ``name`` (rf_resume_normal, _after or
        _advance) under ``tail`` (RF_TAIL_DROP or RF_TAIL_KEEP) and returns its
        ``(epoch, samples)``, or None where it has no state (a step of 0
        samples or larger than the dataset, an overflow)."""
        if self.has(name + "_tail"):
            name, args = name + "_tail", args + (tail,)
        elif tail != RF_TAIL_DROP:
            name += "_tail"  # missing: the error below names it
        fn = getattr(self, name, None)
        if fn is None:
            raise ImportError(
                "ringfeed: the C library %s predates %s; reinstall the package or point %s at a newer libringfeed.so"
                % (self.path, name, LIBRARY_ENV)
            )
        epoch, samples = ctypes.c_uint64(), ctypes.c_uint64()
        if fn(*args, ctypes.byref(epoch), ctypes.byref(samples)) != RF_OK:
            return None
        return (epoch.value, samples.value)


# The library, loaded once for the whole package (ImportError if it cannot be).
LIB = load()


def epoch_steps(dataset_samples, start_samples, per_step, tail):
    """Steps every rank takes in an epoch of ``dataset_samples`` whose first
    ``start_samples`` were consumed before, ``per_step`` (W x B) a step,
    under ``tail``: the library's rule (rf_epoch_steps, ring::resume), the
    one the loader's sampler uses. None where it has none (a step of 0
    samples, a start past the dataset) or with a library too old to say."""
    if not LIB.has("rf_epoch_steps"):
        return None
    steps = ctypes.c_uint64()
    if LIB.rf_epoch_steps(dataset_samples, start_samples, per_step, tail, ctypes.byref(steps)) != RF_OK:
        return None
    return steps.value
