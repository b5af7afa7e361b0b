"""`python -m ringfeed` in a directory others can write to (issue 36, item 13).

Python puts the working directory first on sys.path for `-m`: another user's
`ringfeed/__main__.py` there runs instead of ours. docs/install.md says to run
`ringfeed` (or `python -P -m ringfeed`) on shared machines; ours warns when
it finds itself run from such a directory. The first test shows the danger
is real (and that `-P` avoids it), the second the warning."""

import os
import subprocess
import sys
import tempfile

import pytest

from e2e_util import NOBODY, need_root_and_setpriv

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _python_m(cwd, *flags):
    env = dict(os.environ)
    return subprocess.run([sys.executable, *flags, "-m", "ringfeed", "--version"], cwd=cwd, env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=60)


@pytest.fixture
def world_dir():
    d = tempfile.mkdtemp(dir="/tmp", prefix="ringfeed-pym-")
    os.chmod(d, 0o1777)
    yield d
    subprocess.run(["rm", "-rf", d], check=False)


@pytest.mark.skipif(sys.version_info < (3, 11), reason="python -P is Python 3.11+")
def test_another_users_package_in_the_working_directory_runs_under_python_m_but_not_under_python_p(world_dir):
    need_root_and_setpriv()
    planted = 'import os; open(os.path.join(%r, "RAN"), "w").write(str(os.geteuid()))\n' % world_dir
    subprocess.run(NOBODY + ["sh", "-ec", 'mkdir "$1/ringfeed" && : > "$1/ringfeed/__init__.py" && printf "%s" "$2" > "$1/ringfeed/__main__.py"',
                             "sh", world_dir, planted], check=True, timeout=30)
    _python_m(world_dir, "-P")
    assert not os.path.exists(os.path.join(world_dir, "RAN"))
    _python_m(world_dir)
    with open(os.path.join(world_dir, "RAN")) as f:
        assert f.read() == str(os.geteuid())  # as the caller: what the docs warn of


def test_python_m_ringfeed_warns_in_a_directory_others_can_write_to(world_dir, tmp_path):
    p = _python_m(world_dir)
    assert "ringfeed: warning: `python -m ringfeed` ran in %s, which other users can write to" % world_dir \
        in p.stderr, p.stderr
    assert "`python -P -m ringfeed`" in p.stderr, p.stderr
    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    for cwd, flags in ((str(private), ()), (world_dir, ("-P",) if sys.version_info >= (3, 11) else None)):
        if flags is None:
            continue
        p = _python_m(cwd, *flags)
        assert "other users can write to" not in p.stderr, (cwd, flags, p.stderr)
