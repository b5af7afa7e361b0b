"""A loader's outcome file, from its loader's exit to its removal (issue 39,
item 6): every exited loader left `/dev/shm/.ringfeed-NAME.outcome` for good,
`ringfeed run`'s fresh names made them pile up, and `ringfeed gc` removed all
of the user's, a job's that had just ended included. Now: gc leaves one for a
minute after its loader exits (a late trainer still reads it) and while its
`ringfeed run` still runs the trainers; `ringfeed run` removes its own when
torchrun ends."""

import os
import stat
import subprocess
import sys
import textwrap
import time
import uuid

import pytest

from e2e_util import ringfeed_bin

ringfeed = pytest.importorskip("ringfeed")


def _outcome(name):
    return "/dev/shm/.ringfeed-%s.outcome" % name


def _failed_loader(tmp_path, name):
    """A loader of `name` that fails at once (no such source), leaving its outcome."""
    p = subprocess.run([ringfeed_bin(), "serve", "--source", str(tmp_path / "missing"), "--name", name,
                        "--batch-size", "1"], stderr=subprocess.PIPE, text=True, timeout=60)
    assert p.returncode != 0 and os.path.isfile(_outcome(name)), p.stderr


def _gc():
    p = subprocess.run([ringfeed_bin(), "gc"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=60)
    return p.stdout + p.stderr


def _age(path, seconds):
    """Makes `path` look `seconds` old."""
    t = time.time() - seconds
    os.utime(path, (t, t))


def test_gc_leaves_a_just_exited_loaders_outcome_for_a_late_trainer_and_removes_it_a_minute_later(tmp_path):
    name = "outcome-gc-%s" % uuid.uuid4().hex[:8]
    _failed_loader(tmp_path, name)
    try:
        said = _gc()
        assert os.path.exists(_outcome(name)), said
        assert "kept    the outcome file(s) of" in said and name in said, said
        # A trainer that comes now still learns why, at once.
        with pytest.raises(ringfeed.LoaderGoneError) as e:
            ringfeed.attach(name, 0, timeout=20)
        assert "missing" in str(e.value)
        _age(_outcome(name), 61)
        said = _gc()
        assert not os.path.exists(_outcome(name)), said
        assert "removed the outcome file(s) of" in said and name in said, said
    finally:
        if os.path.lexists(_outcome(name)):
            os.unlink(_outcome(name))


def _fake_torchrun(tmp_path, mark, hold_s):
    """An executable named torchrun that runs one trainer to the end of the
    loader's run, writes `mark`, then keeps the job alive `hold_s` seconds
    (a job's after-training work: an evaluation, a checkpoint)."""
    trainer = textwrap.dedent("""
        import os, ringfeed
        feed = ringfeed.attach(os.environ["RINGFEED_NAME"], 0, timeout=30)
        for batch in feed:
            batch.release()
        feed.close()
    """)
    script = tmp_path / "torchrun"
    script.write_text("#!/bin/sh\n%s -c '%s' || exit 1\ntouch %s\nsleep %d\n" % (sys.executable, trainer, mark,
                                                                                   hold_s))
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return str(script)


def test_run_holds_its_loaders_outcome_against_gc_while_its_job_runs_and_removes_it_at_exit(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    for i in range(4):
        (data / ("s%d" % i)).write_bytes(b"%d" % i)
    mark = tmp_path / "trained"
    name = "outcome-run-%s" % uuid.uuid4().hex[:8]
    torchrun = _fake_torchrun(tmp_path, mark, hold_s=6)
    run = subprocess.Popen([ringfeed_bin(), "run", "--source", str(data), "--batch-size", "1", "--epochs", "1",
                            "--name", name, "--", torchrun, "--nproc-per-node", "1", "train.py"],
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 60
        while not mark.exists() and run.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        assert mark.exists(), run.communicate(timeout=30)[0]
        # The loader served its run and exited; its outcome stays while the job runs,
        # even once older than gc's minute.
        deadline = time.monotonic() + 10
        while not os.path.exists(_outcome(name)) and time.monotonic() < deadline:
            time.sleep(0.1)
        time.sleep(0.5)  # `run` sees its loader's exit within its poll
        _age(_outcome(name), 120)
        said = _gc()
        assert os.path.exists(_outcome(name)), said
        assert "still runs its trainers" in said and name in said, said
        out, _ = run.communicate(timeout=60)
        assert run.returncode == 0, out
        assert not os.path.lexists(_outcome(name)), out
    finally:
        if run.poll() is None:
            run.kill()
            run.wait()
        if os.path.lexists(_outcome(name)):
            os.unlink(_outcome(name))
