"""Helpers shared by the end-to-end tests: binaries, the C compiler, processes."""
import os
import shutil
import signal
import subprocess
import sys
import zlib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def ringfeed_bin():
    path = Path(os.environ.get("RINGFEED_BIN", ROOT / "target" / "release" / "ringfeed"))
    if not path.exists():
        raise RuntimeError("%s is missing: run `cargo build --release` first (or set RINGFEED_BIN)" % path)
    return str(path)


def lib_dir():
    d = Path(os.environ.get("RINGFEED_LIB_DIR", ROOT / "target" / "release"))
    if not (d / "libringfeed.so").exists():
        raise RuntimeError("%s/libringfeed.so is missing: run `cargo build --release -p ringfeed-ffi`" % d)
    return str(d)


def compile_c(source, out_dir):
    """Compiles tests/c/SOURCE against include/ringfeed.h with -Wall -Werror."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        raise RuntimeError("no C compiler (cc) on PATH; install gcc")
    out = Path(out_dir) / Path(source).stem
    libs = lib_dir()
    subprocess.run(
        [cc, "-O2", "-Wall", "-Werror", "-std=c11", "-I", str(ROOT / "include"), str(ROOT / "tests" / "c" / source),
         "-L", libs, "-lringfeed", "-Wl,-rpath," + libs, "-o", str(out)],
        check=True,
    )
    return str(out)


def python_consumer(script, *args):
    return [sys.executable, str(ROOT / "tests" / "python" / "procs" / script)] + [str(a) for a in args]


def crc32(data):
    return zlib.crc32(data)


def wait_all(procs, timeout):
    """Waits for every process; kills all of them if one hangs or fails."""
    outs = []
    try:
        for p in procs:
            out, err = p.communicate(timeout=timeout)
            outs.append((p.returncode, out, err))
    finally:
        kill_survivors(procs)
    return outs


def kill_survivors(procs):
    """Kills and reaps every process still running (a test that failed midway)."""
    for p in procs:
        if p.poll() is None:
            p.kill()
            p.wait()


def serve_until_serving(args):
    """Runs `ringfeed serve ARGS` until it says it serves, then stops it with
    SIGINT; returns (its exit code, all it logged)."""
    loader = subprocess.Popen([ringfeed_bin(), "serve"] + list(args), stderr=subprocess.PIPE, text=True)
    try:
        lines = []
        for line in loader.stderr:
            lines.append(line)
            if line.startswith("ringfeed: serving"):
                loader.send_signal(signal.SIGINT)
        loader.wait(timeout=30)
    finally:
        kill_survivors([loader])
    return loader.returncode, "".join(lines)


# Another user, for the tests of a shared machine (issue 32).
NOBODY = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]


def need_root_and_setpriv():
    """Skips the test unless it can act as another user (root, with setpriv);
    under RINGFEED_TEST_REQUIRE_ROOT=1 (tests/run.sh) that is a failure."""
    import pytest
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        why = "needs root and setpriv to act as another user"
        if os.environ.get("RINGFEED_TEST_REQUIRE_ROOT") == "1":
            pytest.fail(why + " (RINGFEED_TEST_REQUIRE_ROOT=1: run the suite as root)")
        pytest.skip(why)


def as_nobody(script):
    """Runs the shell `script` as uid 65534 (nobody), no groups; it must succeed."""
    need_root_and_setpriv()
    p = subprocess.run(NOBODY + ["sh", "-ec", script], capture_output=True, text=True, timeout=30)
    assert p.returncode == 0, p.stderr

