"""`ringfeed stat NAME`'s exit status, for health checks: 0 while the loader
runs (or once it finished its run), 3 when it is gone without finishing it,
1 when no loader of that name exists."""
import subprocess

from e2e_util import ringfeed_bin


def _stat(name):
    p = subprocess.run([ringfeed_bin(), "stat", name, "--once", "--interval", "0.05"], stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, timeout=20)
    return p.returncode, p.stdout.decode() + p.stderr.decode()


def test_stat_exits_0_for_a_running_loader_and_3_once_it_was_killed(producer):
    loader = producer(world_size=1, batches=8, batch_size=4, sample_bytes=64, slots_per_rank=2)
    rc, out = _stat(loader.name)
    assert rc == 0 and "running" in out, out
    loader.kill()  # SIGKILL: the segment stays behind, the loader's lock goes
    rc, out = _stat(loader.name)
    assert rc == 3, out
    assert "DEAD" in out and "ringfeed gc" in out, out


def test_stat_of_no_such_loader_exits_1(unused_name):
    rc, out = _stat(unused_name)
    assert rc == 1 and "no loader named" in out, out
