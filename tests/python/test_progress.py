"""Progress (issue 39, item 5): where a run is, everywhere a person looks.
/metrics gains the epoch and step gauges and the expected total; `ringfeed
stat` a progress line; the loader a live line on a terminal (a pty here) and
plain lines otherwise; a trainer `feed.progress`. Before, nothing said which
epoch and step a run was at, nor when it would end."""
import os
import pty
import re
import select
import subprocess
import time
import urllib.request
import uuid

import pytest

from e2e_util import kill_survivors, ringfeed_bin

ringfeed = pytest.importorskip("ringfeed")

# 40 files, 2 ranks of 2: 10 steps an epoch; 3 epochs.
FILES, WORLD, BATCH, EPOCHS = 40, 2, 2, 3
EPOCH_STEPS = FILES // (WORLD * BATCH)


@pytest.fixture
def data(tmp_path):
    d = tmp_path / "data"
    d.mkdir()
    for i in range(FILES):
        (d / ("f%02d" % i)).write_bytes(os.urandom(100 + i))
    return d


def _serve_argv(data, name, *flags):
    return [ringfeed_bin(), "serve", "--source", str(data), "--name", name, "--batch-size", str(BATCH),
            "--world-size", str(WORLD), "--epochs", str(EPOCHS), "--manifest-cache", "off", *flags]


def _take(feeds, steps):
    for _ in range(steps):
        for f in feeds:
            f.next(timeout=10).release()


def _gauges(url):
    with urllib.request.urlopen(url, timeout=10) as r:
        body = r.read().decode()
    return {m.group(1): int(float(m.group(2))) for m in re.finditer(r"^(ringfeed_progress_\w+) (\S+)$", body, re.M)}


def test_metrics_stat_and_the_loaders_lines_say_the_epoch_the_step_and_the_total(data):
    name = "progress-%s" % uuid.uuid4().hex[:8]
    loader = subprocess.Popen(_serve_argv(data, name, "--metrics", "127.0.0.1:0"), stderr=subprocess.PIPE, text=True)
    try:
        url = None
        for line in loader.stderr:
            url = url or (re.search(r"metrics at (http://\S+/metrics)", line) or [None])[0]
            if line.startswith("ringfeed: serving"):
                break
        url = re.search(r"http://\S+/metrics", url).group(0)
        feeds = [ringfeed.attach(name, r, timeout=10) for r in range(WORLD)]
        _take(feeds, EPOCH_STEPS + 3)  # into epoch 1, step 3
        want = {
            "ringfeed_progress_epoch": 1,
            "ringfeed_progress_step": 3,
            "ringfeed_progress_epoch_steps": EPOCH_STEPS,
            "ringfeed_progress_epochs": EPOCHS,
            "ringfeed_progress_steps_done": EPOCH_STEPS + 3,
            "ringfeed_progress_steps_expected": EPOCH_STEPS * EPOCHS,
        }
        deadline = time.monotonic() + 5  # the loader writes them every 100 ms
        while _gauges(url) != want and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _gauges(url) == want
        st = subprocess.run([ringfeed_bin(), "stat", name, "--once", "--interval", "0.1"], stdout=subprocess.PIPE,
                            text=True, timeout=30)
        assert "progress: epoch 1 (of 3) step 3/10, 13 of 30 steps taken by every rank" in st.stdout, st.stdout
        # The trainer's own view.
        p = feeds[0].progress
        assert (p.epoch, p.step, p.epoch_steps, p.epochs, p.steps_done, p.steps_total) == (1, 3, 10, 3, 13, 30), p
        assert p.samples_per_s > 0 and p.eta_s >= 0, p
        time.sleep(1.0)  # the loader's line is drawn every 250 ms
        for f in feeds:
            for batch in f:
                batch.release()
            f.close()
        _, err = loader.communicate(timeout=30)
    finally:
        kill_survivors([loader])
    assert loader.returncode == 0, err
    # stderr is no terminal: plain lines, the first once trainers came.
    lines = [line for line in err.splitlines() if "trainer(s)" in line and " step " in line]
    assert lines and re.search(r"epoch \d \(of 3\) step \d+/10, [12]/2 trainer\(s\)", lines[0]), err
    assert "\x1b[" not in err and "\r" not in err, err


def test_on_a_terminal_the_loader_shows_one_live_line(data):
    name = "progress-tty-%s" % uuid.uuid4().hex[:8]
    pid, fd = pty.fork()
    if pid == 0:  # the child: serve on the pty
        os.execv(ringfeed_bin(), _serve_argv(data, name))
    out = b""
    try:
        deadline = time.monotonic() + 20
        while not os.path.exists("/dev/shm/ringfeed-" + name) and time.monotonic() < deadline:
            time.sleep(0.05)
        feeds = [ringfeed.attach(name, r, timeout=10) for r in range(WORLD)]
        _take(feeds, 4)
        deadline = time.monotonic() + 5
        while b"step 4/10" not in out and time.monotonic() < deadline:
            if select.select([fd], [], [], 0.1)[0]:
                out += os.read(fd, 65536)
        for f in feeds:
            for batch in f:
                batch.release()
            f.close()
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            if select.select([fd], [], [], 0.1)[0]:
                try:
                    chunk = os.read(fd, 65536)
                except OSError:
                    break
                if not chunk:
                    break
                out += chunk
        _, status = os.waitpid(pid, 0)
    finally:
        try:
            os.kill(pid, 9)
            os.waitpid(pid, 0)
        except (ProcessLookupError, ChildProcessError):
            pass
        os.close(fd)
    text = out.decode("utf-8", "replace")
    assert os.WEXITSTATUS(status) == 0, text
    # One line redrawn in place (a bar and the words), cleared at the end.
    assert "epoch 0 (of 3) step 4/10, 2/2 trainer(s)" in text, text
    assert "\x1b[" in text and "[" in text, text
    assert "ringfeed: done:" in text, text
    # Not the plain lines a log gets.
    assert "INFO ringfeed::cli::progress" not in text, text
