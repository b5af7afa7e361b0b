"""`pip wheel ./bindings/python` on a terminal (issue 39, item 8): pip hides a
build backend's output, and cargo's first build takes minutes; the build says
each stage, and shows cargo's progress, on the terminal pip runs in. Run
under a pseudo-terminal, as a person at a shell runs it, with the documented
command (`--no-deps`, so that numpy's wheel does not land beside ours).
Before, the terminal showed only pip's own lines for the whole build."""
import os
import pty
import select
import sys
import time
from pathlib import Path

import pytest

from e2e_util import ROOT


def _run_on_a_pty(argv, env, timeout_s):
    """Runs ``argv`` with a pseudo-terminal as its controlling terminal and
    stdout/stderr; returns (exit status, everything it wrote there)."""
    pid, fd = pty.fork()
    if pid == 0:
        os.execvpe(argv[0], argv, env)
    out = b""
    deadline = time.monotonic() + timeout_s
    try:
        while time.monotonic() < deadline:
            if select.select([fd], [], [], 0.2)[0]:
                try:
                    chunk = os.read(fd, 65536)
                except OSError:  # the child closed the pty
                    break
                if not chunk:
                    break
                out += chunk
        _, status = os.waitpid(pid, os.WNOHANG if time.monotonic() >= deadline else 0)
    finally:
        try:
            os.kill(pid, 9)
            os.waitpid(pid, 0)
        except (ProcessLookupError, ChildProcessError):
            pass
        os.close(fd)
    return status, out.decode("utf-8", "replace")


def test_pip_wheel_shows_its_stages_and_cargos_progress_on_the_terminal(tmp_path):
    pytest.importorskip("setuptools")
    dist = tmp_path / "dist"
    # The documented command (README, docs/install.md), run by this
    # environment's pip; --no-build-isolation only so that no index is needed.
    argv = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", str(ROOT / "bindings" / "python"),
            "-w", str(dist)]
    env = dict(os.environ, PIP_DISABLE_PIP_VERSION_CHECK="1")
    env.pop("RINGFEED_BUILD_QUIET", None)
    status, text = _run_on_a_pty(argv, env, 900)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, text
    assert "ringfeed: building libringfeed.so and the ringfeed command: cargo build --release" in text, text
    # cargo's own words, which it writes only to a terminal it was given.
    assert "Finished" in text and "release" in text, text
    assert "ringfeed: cargo finished in" in text, text
    wheels = sorted(p.name for p in Path(dist).iterdir())
    assert len(wheels) == 1 and wheels[0].startswith("ringfeed-"), wheels


def test_the_documented_wheel_command_has_no_deps():
    for doc in ("README.md", "docs/install.md", "bindings/python/README.md"):
        text = (ROOT / doc).read_text()
        assert "pip wheel ./bindings/python" not in text.replace("pip wheel --no-deps ./bindings/python", ""), doc
        assert "pip wheel --no-deps ./bindings/python -w dist" in text, doc
