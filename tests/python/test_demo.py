"""`ringfeed demo`, the README's first command: it must pass its own
exactly-once check and print its figures."""
import subprocess

from e2e_util import kill_survivors, ringfeed_bin


def test_the_demo_passes_its_exactly_once_check_and_prints_its_figures():
    p = subprocess.run([ringfeed_bin(), "demo"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=300)
    out, err = p.stdout.decode(), p.stderr.decode()
    assert p.returncode == 0, out + err
    assert "demo: exactly-once check passed" in out, out + err
    assert "GB/s" in out and "time to first batch per rank" in out, out
    assert "every rank's by" in out, out


def test_the_demo_takes_the_slots_per_rank_its_shared_memory_advice_may_name():
    # A too-small /dev/shm makes the loader advise "--slots-per-rank K fits";
    # the demo takes that flag as serve does, down to 1 slot (no read-ahead).
    p = subprocess.run([ringfeed_bin(), "demo", "--files", "256", "--slots-per-rank", "1"], stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, text=True, timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "demo: exactly-once check passed" in p.stdout, p.stdout + p.stderr
    assert "--slots-per-rank 1: the loader cannot read ahead" in p.stderr, p.stderr


def test_a_consumer_that_dies_stops_the_demo_with_its_rank_instead_of_a_hang():
    import os
    import signal
    import time

    demo = subprocess.Popen([ringfeed_bin(), "demo", "--files", "500", "--epochs", "100000"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 60
        consumers = []
        while len(consumers) < 2:
            assert time.monotonic() < deadline, "the demo started no consumers"
            out = subprocess.run(["pgrep", "-P", str(demo.pid), "-f", "demo-consumer"], stdout=subprocess.PIPE).stdout
            consumers = [int(x) for x in out.split()]
            time.sleep(0.05)
        time.sleep(0.5)  # serving by now
        os.kill(consumers[0], signal.SIGKILL)
        out, err = demo.communicate(timeout=30)
    finally:
        kill_survivors([demo])
    err = err.decode()
    assert demo.returncode == 1, err
    assert "the consumer of rank" in err and "failed" in err and "the loader stopped" in err, err
    assert not os.path.exists("/dev/shm/ringfeed-demo-%d" % demo.pid)


def test_ctrl_c_while_the_demo_writes_its_dataset_stops_it_and_cleans_up():
    import os
    import signal
    import tempfile
    import time

    # Enough files to take several seconds to write on any machine.
    demo = subprocess.Popen([ringfeed_bin(), "demo", "--files", "2000000", "--max-sample-bytes", "64"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    data = os.path.join(tempfile.gettempdir(), "ringfeed-demo-%d" % demo.pid, "data")
    try:
        deadline = time.monotonic() + 30
        while not (os.path.isdir(data) and len(os.listdir(data)) > 100):
            assert time.monotonic() < deadline and demo.poll() is None, "the demo wrote no files"
            time.sleep(0.02)
        demo.send_signal(signal.SIGINT)
        out, err = demo.communicate(timeout=10)
    finally:
        kill_survivors([demo])
    err = err.decode()
    assert demo.returncode == 128 + signal.SIGINT, err  # as serve exits
    assert "stopped by signal 2 while writing the dataset" in err, err
    assert not os.path.exists(os.path.dirname(data)), "the demo left its files"


def test_bad_demo_settings_are_refused_before_anything_is_written(tmp_path):
    import os

    missing = tmp_path / "no-such-dir"
    p = subprocess.run([ringfeed_bin(), "demo", "--files", "64"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                       env=dict(os.environ, TMPDIR=str(missing)), timeout=60)
    assert p.returncode == 1 and "does not exist (TMPDIR?)" in p.stderr, p.stderr
    assert not missing.exists()  # it was made, outside any temporary area
    p = subprocess.run([ringfeed_bin(), "demo", "--files", "1000", "--world-size", "200", "--batch-size", "1"],
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=dict(os.environ, TMPDIR=str(tmp_path)),
                       timeout=60)
    assert p.returncode == 1 and "at most 128 ranks" in p.stderr, p.stderr
    assert list(tmp_path.iterdir()) == [], "it wrote a dataset first"
    p = subprocess.run([ringfeed_bin(), "demo", "--files", "64", "--slots-per-rank", "0"], stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, text=True, env=dict(os.environ, TMPDIR=str(tmp_path)), timeout=60)
    assert p.returncode == 1 and "--slots-per-rank 0: each rank needs at least 1 slot" in p.stderr, p.stderr
    assert list(tmp_path.iterdir()) == [], "it wrote a dataset first"
