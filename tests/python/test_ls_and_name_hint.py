"""Finding loaders (issue 39, item 3): `ringfeed ls` (and `ringfeed stat` with
no name) lists the loaders this user may attach to, one line each (name,
owner, pid, ranks attached, epoch and step, state); a trainer waiting for a
name that does not exist says within 6 s which names do, closest first,
and waits on. Before, `stat` needed a name, no command listed loaders, and
a misspelled RINGFEED_NAME cost the whole timeout in silence. The hint comes
from the library, so a C trainer (rf_attach called directly, here through
ctypes) says it too."""
import os
import queue
import re
import subprocess
import sys
import threading
import time
import uuid

import pytest

from e2e_util import kill_survivors, ringfeed_bin

ringfeed = pytest.importorskip("ringfeed")

HINT_WITHIN_S = 6.0


@pytest.fixture
def loader(tmp_path):
    """`ringfeed serve` of 40 files to 2 ranks for 2 epochs, named job-...;
    yields (name, process)."""
    data = tmp_path / "data"
    data.mkdir()
    for i in range(40):
        (data / ("f%02d" % i)).write_bytes(os.urandom(100 + i))
    name = "lsjob-%s" % uuid.uuid4().hex[:8]
    p = subprocess.Popen(
        [ringfeed_bin(), "serve", "--source", str(data), "--name", name, "--batch-size", "2", "--world-size", "2",
         "--epochs", "2", "--manifest-cache", "off"],
        stderr=subprocess.PIPE, text=True,
    )
    try:
        for line in p.stderr:
            if line.startswith("ringfeed: serving"):
                break
        else:
            raise AssertionError("the loader did not start (exit %s)" % p.wait())
        yield name, p
    finally:
        kill_survivors([p])


def _row(out, name):
    rows = [line for line in out.splitlines() if line.split()[:1] == [name]]
    assert len(rows) == 1, out
    return rows[0]


def test_ls_and_stat_without_a_name_list_the_loaders_this_user_may_attach_to(loader):
    name, proc = loader
    feed = ringfeed.attach(name, 0, timeout=10)
    try:
        for _ in range(3):
            feed.next(timeout=10).release()
        for argv in (["ls"], ["stat"]):
            p = subprocess.run([ringfeed_bin()] + argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               timeout=30)
            assert p.returncode == 0, p.stderr
            head = p.stdout.splitlines()[0].split()
            assert head == ["NAME", "OWNER", "PID", "RANKS", "PROGRESS", "STATE"], p.stdout
            row = _row(p.stdout, name)
            owner = "uid %d" % os.geteuid()
            assert owner in row and " %d " % proc.pid in row, row
            assert "1/2 attached" in row, row
            # Rank 1 took nothing yet: every rank has taken 0 steps of the
            # 10 of epoch 0 (40 files, 2 ranks of 2).
            assert "epoch 0 (of 2) step 0/10" in row, row
            assert row.rstrip().endswith("running"), row
    finally:
        feed.close()


def _stderr_lines(proc):
    """A queue of (seconds since now, line) of ``proc``'s stderr."""
    q = queue.Queue()
    start = time.monotonic()

    def read():
        for line in proc.stderr:
            q.put((time.monotonic() - start, line))
        q.put((time.monotonic() - start, None))

    threading.Thread(target=read, daemon=True).start()
    return q


def _first_line_with(q, text, within_s):
    deadline = time.monotonic() + within_s + 2
    seen = []
    while time.monotonic() < deadline:
        try:
            at, line = q.get(timeout=0.2)
        except queue.Empty:
            continue
        if line is None:
            break
        seen.append(line)
        if text in line:
            return at, line
    raise AssertionError("no line with %r within %.0f s; stderr so far:\n%s" % (text, within_s, "".join(seen)))


PYTHON_TRAINER = "import ringfeed; ringfeed.attach(%r, 0, timeout=30)"
C_TRAINER = (
    "import ctypes, sys; from ringfeed import _lib; feed = ctypes.c_void_p(); "
    "rc = _lib.LIB.rf_attach(%r.encode(), 0, 30000, ctypes.byref(feed)); "
    "print(rc, _lib.LIB.last_error(), file=sys.stderr, flush=True)"
)


@pytest.mark.parametrize("trainer", [PYTHON_TRAINER, C_TRAINER], ids=["python", "c library"])
def test_a_trainer_waiting_for_a_misspelled_name_names_the_running_loaders_within_6_s(loader, trainer):
    name, _ = loader
    wrong = name.replace("lsjob", "lsjbo")
    p = subprocess.Popen([sys.executable, "-c", trainer % wrong], stderr=subprocess.PIPE, text=True)
    try:
        lines = _stderr_lines(p)
        at, line = _first_line_with(lines, "closest first", HINT_WITHIN_S)
        assert at <= HINT_WITHIN_S, "the hint came after %.1f s: %s" % (at, line)
        assert p.poll() is None, "the trainer gave up its wait: %s" % line
        # Ours is the closest running name (one transposition away).
        assert re.search(r'closest first: "%s"' % name, line), line
        assert wrong in line, line
    finally:
        kill_survivors([p])


def test_the_timeout_error_names_the_running_loaders_too(loader):
    name, _ = loader
    wrong = name + "x"
    with pytest.raises(ringfeed.FeedTimeoutError) as e:
        ringfeed.attach(wrong, 0, timeout=0.5)
    assert 'loaders running here, closest first: "%s"' % name in str(e.value), str(e.value)


def test_stat_of_a_missing_name_names_the_running_loaders(loader):
    name, _ = loader
    p = subprocess.run([ringfeed_bin(), "stat", name[:-1], "--once"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                       text=True, timeout=30)
    assert p.returncode == 1
    assert 'closest first: "%s"' % name in p.stderr, p.stderr
