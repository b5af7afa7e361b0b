"""One version from one place, and `python -m ringfeed` (issue 31). The wheel
itself, installed in a fresh venv without Rust, is tests/wheel/check.sh."""

import os
import subprocess
import sys
import tomllib

import ringfeed

from conftest import BINDINGS, REPO


def test_the_package_version_is_the_workspace_version_in_cargo_toml():
    with open(REPO / "Cargo.toml", "rb") as f:
        cargo = tomllib.load(f)["workspace"]["package"]["version"]
    assert ringfeed.__version__ == cargo


def test_python_m_ringfeed_from_a_checkout_says_the_command_is_not_installed_and_the_fix(tmp_path):
    # The checkout's package is no installed distribution's: there is no
    # command of its own to run, and another ringfeed's command is not taken.
    env = dict(os.environ, PYTHONPATH=str(BINDINGS))
    out = subprocess.run(
        [sys.executable, "-m", "ringfeed", "--version"],
        cwd=str(tmp_path), env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=60,
    )
    assert out.returncode == 127, out.stdout
    assert "the ringfeed command is not installed with this package" in out.stdout, out.stdout
    assert "pip install ./bindings/python" in out.stdout and "target/release/ringfeed" in out.stdout, out.stdout
