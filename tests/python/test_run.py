"""`ringfeed run [serve flags] -- torchrun ...`: the loader and the job as one
command. examples/train_ddp.py trains under it with DDP on CPU (gloo), two
ranks; the loader takes its world size from torchrun's flags and its name
reaches the ranks through RINGFEED_NAME."""
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest

from e2e_util import ROOT, ringfeed_bin

RECORD_BYTES = 256  # 128 uint16 tokens, as the example expects
EXAMPLE = str(ROOT / "examples" / "train_ddp.py")


def _torchrun():
    pytest.importorskip("torch")
    found = shutil.which("torchrun", path=str(Path(sys.executable).parent)) or shutil.which("torchrun")
    if found is None:
        pytest.fail("torchrun not found next to %s; install torch" % sys.executable)
    return found


def _records(directory, shards=3, records=100):
    """A tokenized dataset: `shards` files of `records` records each."""
    directory.mkdir(exist_ok=True)
    for shard in range(shards):
        (directory / ("shard-%d.bin" % shard)).write_bytes(os.urandom(RECORD_BYTES * records))
    return directory


def _env(**extra):
    return dict(os.environ, OMP_NUM_THREADS="1", **extra)


def _serve_flags(data, *more):
    return ["--source", str(data), "--batch-size", "4", "--record-bytes", str(RECORD_BYTES), *more]


def _loader_name(out):
    found = re.search(r'ringfeed run: loader "([^"]+)"', out)
    assert found, out
    return found.group(1)


def _processes_of(name):
    """Processes whose environment holds RINGFEED_NAME=name: torchrun and its ranks."""
    needle = b"RINGFEED_NAME=" + name.encode() + b"\0"
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open("/proc/%s/environ" % entry, "rb") as f:
                if needle in f.read():
                    pids.append(int(entry))
        except OSError:
            continue
    return pids


class _Lines:
    """A running `ringfeed run`, its stdout and stderr read as they come."""

    def __init__(self, cmd, env):
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env)
        self.lines = []
        self._seen = threading.Condition()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        for line in self.proc.stdout:
            with self._seen:
                self.lines.append(line.decode(errors="replace"))
                self._seen.notify_all()

    def wait_for(self, text, timeout):
        deadline = time.monotonic() + timeout
        with self._seen:
            while not any(text in line for line in self.lines):
                left = deadline - time.monotonic()
                if left <= 0 or self.proc.poll() is not None and not self._seen.wait(0.2):
                    raise AssertionError("no %r within %s s; output:\n%s" % (text, timeout, self.text()))
                self._seen.wait(min(left, 0.5))

    def finish(self, timeout):
        rc = self.proc.wait(timeout=timeout)
        time.sleep(0.2)  # the reader thread takes the last lines
        return rc, self.text()

    def text(self):
        return "".join(self.lines)

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def test_run_trains_the_example_to_the_end_and_exits_0(tmp_path):
    torchrun = _torchrun()
    data = _records(tmp_path / "data")
    job = subprocess.run(
        [ringfeed_bin(), "run", *_serve_flags(data, "--epochs", "2"),
         "--", torchrun, "--standalone", "--nproc-per-node", "2", EXAMPLE],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=_env(), timeout=240,
    )
    out = job.stdout.decode(errors="replace")
    assert job.returncode == 0, out
    name = _loader_name(out)
    # torchrun's flags gave the loader its world size: 2 ranks.
    assert "ringfeed run: loader %r for 2 rank(s) (2 per machine)" % name in out.replace('"', "'"), out
    # 300 records, W×B = 8 per step: 37 steps per epoch, 2 epochs, 2 ranks;
    # the loader saw every batch released and ended by itself.
    assert "ringfeed: done: 148 batches, 592 samples" in out, out
    assert "epoch 1 step 20 loss" in out, out
    assert "stopping the loader" not in out, out
    assert not os.path.exists("/dev/shm/ringfeed-" + name)


def test_sigterm_to_run_stops_torchrun_its_ranks_and_the_loader_and_exits_143(tmp_path):
    torchrun = _torchrun()
    data = _records(tmp_path / "data")
    name = "run-term-%s" % uuid.uuid4().hex[:8]
    run = _Lines(
        [ringfeed_bin(), "run", *_serve_flags(data, "--epochs", "1000", "--name", name),
         "--", torchrun, "--standalone", "--nproc-per-node", "2", EXAMPLE],
        _env(),
    )
    try:
        run.wait_for("epoch 0 step 0 loss", timeout=180)  # training is under way
        assert os.path.exists("/dev/shm/ringfeed-" + name)
        assert len(_processes_of(name)) >= 3, "torchrun and two ranks should run"
        run.proc.send_signal(signal.SIGTERM)
        rc, out = run.finish(timeout=90)
        assert rc == 143, out
        assert "ringfeed run: stopped by signal 15" in out, out
        assert not os.path.exists("/dev/shm/ringfeed-" + name), "the loader left its segment:\n" + out
        assert _processes_of(name) == [], "torchrun or a rank outlived ringfeed run:\n" + out
    finally:
        run.kill()
        for pid in _processes_of(name):
            os.kill(pid, signal.SIGKILL)


def test_a_source_that_does_not_exist_is_the_error_shown_and_torchrun_never_starts(tmp_path):
    missing = tmp_path / "no-such-dir"
    # A stand-in for torchrun that leaves a mark if it is started.
    marker = tmp_path / "torchrun-started"
    fake = tmp_path / "bin" / "torchrun"
    fake.parent.mkdir()
    fake.write_text("#!/bin/sh\ntouch %s\n" % marker)
    fake.chmod(0o755)
    job = subprocess.run(
        [ringfeed_bin(), "run", "--source", str(missing), "--batch-size", "4",
         "--", str(fake), "--nproc-per-node", "2", EXAMPLE],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=_env(), timeout=60,
    )
    out = job.stdout.decode(errors="replace")
    assert job.returncode == 1, out
    last = out[out.index("failed (exit 1) before torchrun started. Its last lines:"):]
    assert str(missing) in last and "ringfeed: error:" in last and "does not exist" in last, out
    assert not marker.exists(), "torchrun was started for a loader that failed:\n" + out


def test_a_loader_that_fails_mid_run_stops_torchrun_and_its_error_is_printed_last(tmp_path):
    torchrun = _torchrun()
    data = _records(tmp_path / "data")
    name = "run-fail-%s" % uuid.uuid4().hex[:8]
    run = _Lines(
        [ringfeed_bin(), "run", *_serve_flags(data, "--epochs", "1000", "--name", name),
         "--", torchrun, "--standalone", "--nproc-per-node", "2", "--max-restarts", "3", EXAMPLE],
        _env(),
    )
    try:
        run.wait_for("epoch 0 step 0 loss", timeout=180)
        # Every record file shrinks under the loader: its next read fails.
        for shard in data.iterdir():
            os.truncate(shard, 0)
        rc, out = run.finish(timeout=120)
        assert rc == 1, out
        # The loader's own error closes the output, after whatever the ranks
        # printed; with --max-restarts 3 torchrun would otherwise have
        # restarted ranks that wait for a loader that is gone.
        last = out[out.rindex("ringfeed run: the loader"):]
        # (Seen first, as a rule, or after the ranks' AbortedError ended torchrun.)
        assert re.search(r"failed \(exit 1\)(, and torchrun was stopped| while torchrun ran \(torchrun: exit 1\))\. "
                         r"Its last lines:", last), out
        assert "ringfeed: error:" in last and "shard-" in last, last
        assert not os.path.exists("/dev/shm/ringfeed-" + name), out
        assert _processes_of(name) == [], "torchrun or a rank outlived ringfeed run:\n" + out
    finally:
        run.kill()
        for pid in _processes_of(name):
            os.kill(pid, signal.SIGKILL)


def test_a_rank_crash_under_max_restarts_recovers_with_the_same_loader(tmp_path):
    pytest.importorskip("torch")
    data = _records(tmp_path / "data")
    # torch.distributed.run as a module, with torchrun's = and _ spellings.
    job = subprocess.run(
        [ringfeed_bin(), "run", *_serve_flags(data, "--epochs", "1"),
         "--", sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "--max_restarts=1",
         EXAMPLE],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=300,
        # torch 2.15's restarted gloo ranks could read the crashed rank's old
        # address from the rendezvous store the agent shares across restarts
        # ("connectFullMesh failed ... Connection refused" to the old port):
        # rank 0 then hosts a fresh store for each attempt.
        env=_env(CRASH_AT_STEP="5", TORCH_DISABLE_SHARE_RDZV_TCP_STORE="1"),
    )
    out = job.stdout.decode(errors="replace")
    assert job.returncode == 0, out
    assert "rank 1 crashing on purpose at step 5" in out, out
    # One loader served both attempts, to the end of the run.
    assert out.count("ringfeed: serving") == 1, out
    assert "ringfeed: done:" in out and "epoch 0 step 20 loss" in out, out
    assert not os.path.exists("/dev/shm/ringfeed-" + _loader_name(out))


def test_the_same_command_on_two_machines_gives_each_loader_its_share_of_the_job(tmp_path):
    """Two torchrun launchers meeting on 127.0.0.1 stand in for two machines,
    each running the same `ringfeed run` but for its --node-rank: each loader
    is started with --world-size 2 --nnodes 2 and its place, serves its one
    rank the job rank's batches, and both train to the end."""
    import socket

    torchrun = _torchrun()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = str(s.getsockname()[1])
    runs = []
    try:
        for node in range(2):
            data = _records(tmp_path / ("machine%d" % node))  # each machine's own copy
            if node == 1:
                for shard in (tmp_path / "machine0").iterdir():
                    (data / shard.name).write_bytes(shard.read_bytes())
            runs.append(subprocess.Popen(
                [ringfeed_bin(), "run", *_serve_flags(data, "--epochs", "1"),
                 "--", torchrun, "--nnodes", "2", "--node-rank", str(node), "--master-addr", "127.0.0.1",
                 "--master-port", port, "--nproc-per-node", "1", EXAMPLE],
                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=_env()))
        outs = [p.communicate(timeout=240)[0].decode(errors="replace") for p in runs]
        for node, (p, out) in enumerate(zip(runs, outs)):
            assert p.returncode == 0, "machine %d:\n%s" % (node, out)
            assert "for 2 rank(s) (1 per machine, machine %d of 2)" % node in out, out
            # 300 records, W×B = 8 per step: 37 steps, one rank per machine;
            # job ranks node..node of 2.
            assert "job ranks %d to %d of 2" % (node, node) in out, out
            assert "ringfeed: done: 37 batches, 148 samples" in out, out
    finally:
        for p in runs:
            if p.poll() is None:
                p.kill()
                p.wait()


@pytest.mark.parametrize("flags,command,message", [
    ([], ["echo", "train.py"], '"echo" after -- is not torchrun'),
    (["--world-size", "4"], ["torchrun", "--nproc-per-node", "2", "train.py"],
     "--world-size comes from torchrun's flags in ringfeed run (here --world-size 2"),
    ([], ["torchrun", "--nproc-per-node", "auto", "train.py"], "--nproc-per-node auto: ringfeed run sizes the loader"),
    ([], ["torchrun", "--nnodes", "1:4", "train.py"], "lets the number of machines change"),
    ([], ["torchrun", "--nnodes", "2", "--rdzv-backend", "c10d", "train.py"], "use static rendezvous"),
    ([], ["torchrun", "--nproc-per-node", "2"], "has no training script"),
], ids=["not torchrun", "world size given", "nproc auto", "elastic nnodes", "c10d on two machines", "no script"])
def test_a_command_line_run_cannot_size_the_loader_from_is_refused_before_anything_starts(flags, command, message):
    job = subprocess.run([ringfeed_bin(), "run", "--source", "/nonexistent", "--batch-size", "4", *flags, "--", *command],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=30)
    err = job.stderr.decode()
    assert job.returncode == 2, err
    assert message in err, err
    assert "ringfeed run: loader" not in err, err
