"""The package's version: the ringfeed workspace's one version.

``[workspace.package] version`` in the workspace's Cargo.toml is the one place
the version is written: the crates (and so ``ringfeed --version`` and the
library's ABI-mismatch message) take it from there, and setup.py gives it to
the Python package. setup.py replaces this file in a built wheel with the
literal version; from a checkout (``PYTHONPATH=bindings/python``) it is read
from the Cargo.toml three directories up.
"""

import os
import re


def cargo_version(cargo_toml):
    """``[workspace.package] version`` of ``cargo_toml``, or None when the file
    or the key is missing."""
    try:
        with open(cargo_toml, encoding="utf-8") as f:
            text = f.read()
    except OSError:
        return None
    section = None
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip()
        header = re.fullmatch(r"\[([^\[\]]+)\]", line)
        if header:
            section = header.group(1).strip()
            continue
        if section == "workspace.package":
            value = re.fullmatch(r'version\s*=\s*"([^"]+)"', line)
            if value:
                return value.group(1)
    return None


__version__ = (
    cargo_version(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "Cargo.toml"))
    or "0+unknown"
)
