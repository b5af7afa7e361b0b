"""`ringfeed stat` and `ls` on a shared machine (issue 36, item 5): a loader
of another user (nobody, through setpriv) is not shown as if it were this
user's. stat applies attach's trust rule (refused, naming the owner and
RINGFEED_TRUST_UID, unless that says so) and names the owner in its first
line; ls leaves such loaders out and counts them; header text a segment's
owner wrote (the reader backend) is shown only as printable ASCII. Before,
root's `stat NAME` showed nobody's loader like its own, and printed the
header's bytes, escape sequences included, to root's terminal."""
import os
import re
import shutil
import signal
import subprocess
import tempfile
import uuid

import pytest

from e2e_util import NOBODY, as_nobody, kill_survivors, need_root_and_setpriv, ringfeed_bin

# The reader backend's 16 bytes in the header (docs/ring-layout.md).
READER_BACKEND_OFFSET = 160


@pytest.fixture
def nobodys_loader():
    """A test producer run by nobody: yields (name, process)."""
    need_root_and_setpriv()
    shared = tempfile.mkdtemp(dir="/tmp")
    os.chmod(shared, 0o755)
    binary = shutil.copy(ringfeed_bin(), shared)
    name = "nobodys-%s" % uuid.uuid4().hex[:8]
    p = subprocess.Popen(NOBODY + [binary, "ring-test-producer", "--name", name, "--batches", "1000"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert p.stdout.readline().strip() == "ready", p.stderr.read()
        assert os.stat("/dev/shm/ringfeed-" + name).st_uid == 65534
        yield name, p
    finally:
        kill_survivors([p])
        if os.path.lexists("/dev/shm/ringfeed-" + name):
            os.unlink("/dev/shm/ringfeed-" + name)
        shutil.rmtree(shared, ignore_errors=True)


def _ringfeed(*args, trust=None):
    env = dict(os.environ)
    env.pop("RINGFEED_TRUST_UID", None)
    if trust is not None:
        env["RINGFEED_TRUST_UID"] = trust
    return subprocess.run([ringfeed_bin(), *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          timeout=30, env=env)


def test_stat_refuses_another_users_loader_unless_trusted_and_then_names_its_owner(nobodys_loader):
    name, _ = nobodys_loader
    p = _ringfeed("stat", name, "--once")
    assert p.returncode == 1, p.stdout
    assert "uid 65534" in p.stderr and "RINGFEED_TRUST_UID=65534" in p.stderr, p.stderr
    assert p.stdout == "", p.stdout
    p = _ringfeed("stat", name, "--once", "--interval", "0.1", trust="65534")
    assert p.returncode == 0, p.stderr
    first = p.stdout.splitlines()[0]
    assert first.startswith('loader "%s" of uid 65534' % name), first


def test_ls_leaves_other_users_loaders_out_and_counts_them(nobodys_loader):
    name, _ = nobodys_loader
    p = _ringfeed("ls")
    assert p.returncode == 0, p.stderr
    assert name not in p.stdout, p.stdout
    assert re.search(r"\(\d+ loader\(s\) of other users not shown", p.stdout), p.stdout
    p = _ringfeed("ls", trust="65534")
    row = [line for line in p.stdout.splitlines() if line.startswith(name + " ")]
    assert len(row) == 1 and "uid 65534" in row[0], p.stdout


def test_header_text_another_user_wrote_is_shown_only_as_printable_ascii(nobodys_loader):
    name, loader = nobodys_loader
    loader.send_signal(signal.SIGKILL)  # its segment stays, as nobody left it
    loader.wait(timeout=10)
    as_nobody(r"printf '\033]0;PWNED\007\033[2J' | dd of=/dev/shm/ringfeed-%s bs=1 seek=%d conv=notrunc status=none"
              % (name, READER_BACKEND_OFFSET))
    p = _ringfeed("stat", name, "--once", trust="65534")
    assert "\x1b" not in p.stdout and "\x07" not in p.stdout, repr(p.stdout)
    assert "reader (not printable)" in p.stdout, p.stdout
    assert "DEAD" in p.stdout, p.stdout


def test_a_ring_linked_under_another_name_is_not_shown_as_that_names_loader(tmp_path):
    """A hard link of loader A's ring named B is A's ring (issue 36 item 3's
    name tag): stat B refuses it, as attach does, and ls does not list it as
    a loader B."""
    from e2e_util import ringfeed_bin as binary

    a = "linked-a-%s" % uuid.uuid4().hex[:8]
    b = "linked-b-%s" % uuid.uuid4().hex[:8]
    p = subprocess.Popen([binary(), "ring-test-producer", "--name", a, "--batches", "1000"], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    try:
        assert p.stdout.readline().strip() == "ready", p.stderr.read()
        os.link("/dev/shm/ringfeed-" + a, "/dev/shm/ringfeed-" + b)
        st = _ringfeed("stat", b, "--once")
        assert st.returncode == 1 and st.stdout == "", st.stdout
        assert "/dev/shm/ringfeed-%s" % b in st.stderr, st.stderr
        ls = _ringfeed("ls")
        row = [line for line in ls.stdout.splitlines() if line.startswith(b + " ")]
        assert len(row) == 1 and "cannot be read" in row[0] and "running" not in row[0], ls.stdout
    finally:
        kill_survivors([p])
        for name in (a, b):
            if os.path.lexists("/dev/shm/ringfeed-" + name):
                os.unlink("/dev/shm/ringfeed-" + name)
