"""`pip install ./bindings/python` in a fresh virtual environment gives a working
`import ringfeed` with libringfeed.so inside the installed package, and the
`ringfeed` command (also `python -m ringfeed`) of the same version.

Needs the network (numpy, setuptools) and cargo (the build hook runs
`cargo build --release -p ringfeed-ffi -p ringfeed`). RINGFEED_SKIP_INSTALL_TEST=1 skips it.
"""

import os
import shutil
import subprocess
import sys
import textwrap

import pytest

from conftest import BINDINGS, Producer, _probe_producer

pytestmark = pytest.mark.skipif(os.environ.get("RINGFEED_SKIP_INSTALL_TEST") == "1", reason="RINGFEED_SKIP_INSTALL_TEST=1")

CHECK = textwrap.dedent(
    """
    import importlib.metadata, os, sys
    import ringfeed
    package = os.path.dirname(ringfeed.__file__)
    assert "site-packages" in package, package
    assert ringfeed.library_path == os.path.join(package, "libringfeed.so"), ringfeed.library_path
    assert os.path.isfile(ringfeed.library_path)
    assert ringfeed.abi_version() >= 1
    try:
        ringfeed.attach("bad/name", 0, timeout=0)
    except ringfeed.InvalidArgumentError:
        pass
    else:
        raise AssertionError("a bad name was accepted")
    wheel = importlib.metadata.distribution("ringfeed").read_text("WHEEL")
    assert "Root-Is-Purelib: false" in wheel, wheel
    tags = [l.split(": ")[1] for l in wheel.splitlines() if l.startswith("Tag: ")]
    assert tags and all(t.startswith("py3-none-") and not t.endswith("-any") for t in tags), tags
    # The wheel's script: the ringfeed command beside python, of the same version.
    import subprocess
    assert ringfeed.__version__ == importlib.metadata.version("ringfeed"), ringfeed.__version__
    command = os.path.join(os.path.dirname(sys.executable), "ringfeed")
    for argv in ([command, "--version"], [sys.executable, "-m", "ringfeed", "--version"]):
        out = subprocess.run(argv, stdout=subprocess.PIPE, text=True, check=True).stdout.strip()
        assert out == "ringfeed " + ringfeed.__version__, (argv, out)
    name = sys.argv[1] if len(sys.argv) > 1 else None
    if name:
        with ringfeed.attach(name, 0, timeout=10) as feed:
            steps = []
            for batch in feed:
                assert bytes(batch.sample(0)[:3]) == bytes((batch.indices[0] * 7 + p) % 251 for p in range(3))
                steps.append(batch.step)
                batch.release()
        assert steps == [0, 1], steps
    print("installed ringfeed works")
    """
)


def test_pip_install_into_a_fresh_venv_bundles_the_library(tmp_path):
    if shutil.which("cargo") is None and not os.environ.get("RINGFEED_BUILD_LIB"):
        pytest.skip("neither cargo nor RINGFEED_BUILD_LIB: nothing to bundle")
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    python = str(venv / "bin" / "python")
    env = {k: v for k, v in os.environ.items() if k not in ("RINGFEED_LIB", "PYTHONPATH", "PYTHONHOME")}
    install = subprocess.run(
        [python, "-m", "pip", "install", "--disable-pip-version-check", "-q", str(BINDINGS)],
        cwd=str(tmp_path),
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=900,
    )
    assert install.returncode == 0, install.stdout[-5000:]
    # The checkout must not be what gets imported: run from elsewhere, no PYTHONPATH.
    args = [python, "-c", CHECK]
    producer = None
    if _probe_producer() is None:
        producer = Producer(world_size=1, batches=2, batch_size=2, sample_bytes=16, slots_per_rank=2)
        args.append(producer.name)
    try:
        check = subprocess.run(args, cwd=str(tmp_path), env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=120)
    finally:
        if producer is not None:
            producer.cleanup()
    assert check.returncode == 0, check.stdout
    assert "installed ringfeed works" in check.stdout
