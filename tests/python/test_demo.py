"""`ringfeed demo`, the README's first command: it must pass its own
exactly-once check and print its figures."""
import subprocess

from e2e_util import ringfeed_bin


def test_the_demo_passes_its_exactly_once_check_and_prints_its_figures():
    p = subprocess.run([ringfeed_bin(), "demo"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=300)
    out, err = p.stdout.decode(), p.stderr.decode()
    assert p.returncode == 0, out + err
    assert "demo: exactly-once check passed" in out, out + err
    assert "GB/s" in out and "time from attach to first batch per rank" in out, out
    assert "every rank's by" in out, out
