"""The binding loads the C library and mirrors its ABI; no loader needed."""

import builtins
import ctypes
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ringfeed = pytest.importorskip("ringfeed")
from ringfeed import _lib  # noqa: E402


def test_structs_have_the_sizes_of_the_c_abi():
    assert ctypes.sizeof(_lib.rf_sample) == 24
    assert ctypes.sizeof(_lib.rf_batch) == 56
    assert ctypes.sizeof(_lib.rf_info) == 48


def test_struct_fields_sit_at_the_c_offsets():
    assert [_lib.rf_batch.__dict__[f].offset for f in ("data", "samples", "n_samples", "slot", "epoch", "step", "generation", "data_len")] == [
        0, 8, 16, 20, 24, 32, 40, 48,
    ]
    assert [_lib.rf_info.__dict__[f].offset for f in ("world_size", "rank", "slots_per_rank", "max_samples_per_slot", "slot_payload_bytes", "payload_region", "payload_region_bytes", "batches_expected")] == [
        0, 4, 8, 12, 16, 24, 32, 40,
    ]


def test_abi_version_is_a_positive_int():
    assert isinstance(ringfeed.abi_version(), int)
    assert ringfeed.abi_version() >= 1


def test_library_path_is_the_one_loaded():
    assert os.path.isfile(ringfeed.library_path)
    expected = os.environ.get("RINGFEED_LIB") or os.path.join(os.path.dirname(ringfeed.__file__), "libringfeed.so")
    assert ringfeed.library_path == expected


def test_every_error_is_a_ringfeed_error_and_a_runtime_error():
    classes = [
        ringfeed.LoaderGoneError, ringfeed.AbortedError, ringfeed.CorruptSegmentError,
        ringfeed.VersionMismatchError, ringfeed.RankError, ringfeed.RankBusyError,
        ringfeed.StaleBatchError, ringfeed.TimeoutError, ringfeed.InvalidArgumentError,
        ringfeed.IOFailureError, ringfeed.InternalError, ringfeed.AllSlotsHeldError,
        ringfeed.ForkedError, ringfeed.UntrustedLoaderError,
    ]
    for cls in classes:
        assert issubclass(cls, ringfeed.Error) and issubclass(cls, RuntimeError), cls
    assert issubclass(ringfeed.TimeoutError, builtins.TimeoutError)
    assert issubclass(ringfeed.RankError, ValueError)
    assert issubclass(ringfeed.InvalidArgumentError, ValueError)


def test_a_star_import_leaves_the_builtin_timeout_error_alone():
    # ringfeed.TimeoutError (now FeedTimeoutError) was in __all__, so
    # `from ringfeed import *` replaced the builtin in the importer's names.
    names = {}
    exec("from ringfeed import *", names)
    assert names.get("TimeoutError", builtins.TimeoutError) is builtins.TimeoutError
    assert names["FeedTimeoutError"] is ringfeed.FeedTimeoutError
    assert ringfeed.TimeoutError is ringfeed.FeedTimeoutError  # the old name, for a release
    assert issubclass(ringfeed.FeedTimeoutError, builtins.TimeoutError)


def test_every_error_code_maps_to_its_class():
    from ringfeed.errors import error_for

    assert type(error_for(_lib.RF_E_LOADER_GONE, "m")) is ringfeed.LoaderGoneError
    assert type(error_for(_lib.RF_E_ABORTED, "m")) is ringfeed.AbortedError
    assert type(error_for(_lib.RF_E_CORRUPT, "m")) is ringfeed.CorruptSegmentError
    assert type(error_for(_lib.RF_E_VERSION, "m")) is ringfeed.VersionMismatchError
    assert type(error_for(_lib.RF_E_RANK, "m")) is ringfeed.RankError
    assert type(error_for(_lib.RF_E_BUSY, "m")) is ringfeed.RankBusyError
    assert type(error_for(_lib.RF_E_STALE, "m")) is ringfeed.StaleBatchError
    assert type(error_for(_lib.RF_E_IO, "m")) is ringfeed.IOFailureError
    assert type(error_for(_lib.RF_E_INTERNAL, "m")) is ringfeed.InternalError
    assert type(error_for(_lib.RF_E_INVALID, "m")) is ringfeed.InvalidArgumentError
    assert type(error_for(_lib.RF_TIMEOUT, "m")) is ringfeed.TimeoutError
    assert type(error_for(_lib.RF_E_HELD, "m")) is ringfeed.AllSlotsHeldError
    assert type(error_for(_lib.RF_E_FORKED, "m")) is ringfeed.ForkedError
    assert type(error_for(_lib.RF_E_UNTRUSTED, "m")) is ringfeed.UntrustedLoaderError
    unknown = error_for(-99, "m")
    assert type(unknown) is ringfeed.Error and "-99" in str(unknown)


def test_ringfeed_lib_pointing_nowhere_fails_the_import_naming_the_path(tmp_path):
    missing = str(tmp_path / "nowhere" / "libringfeed.so")
    env = dict(os.environ, RINGFEED_LIB=missing, PYTHONPATH=os.pathsep.join(sys.path))
    out = subprocess.run(
        [sys.executable, "-c", "import ringfeed"], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    assert out.returncode != 0
    assert "ImportError" in out.stdout and missing in out.stdout


def test_every_return_code_of_the_header_has_the_same_value_in_the_binding():
    header = (Path(__file__).resolve().parents[2] / "include" / "ringfeed.h").read_text()
    # The codes are the variants of `enum rf_status` ("  RF_E_INVALID = -1,").
    codes = dict(re.findall(r"^\s+(RF_(?:OK|END|TIMEOUT|E_[A-Z_]+)) = (-?\d+),?$", header, re.M))
    assert len(codes) >= 15, codes
    for name, value in codes.items():
        assert getattr(_lib, name, None) == int(value), "%s is %s in the header, %r in the binding" % (name, value, getattr(_lib, name, None))
