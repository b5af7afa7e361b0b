"""Where the ``ringfeed`` command of this package is, for ``python -m ringfeed``.

The wheel installs the executable as its script: pip puts it in the
environment's ``bin/`` (the scheme's scripts directory), beside ``python``,
and lists it in the package's RECORD. That list says where it went under the
scheme it was installed with (tests/wheel/check.sh checks a venv), and that it
belongs to this very package (not to another ringfeed of another version).
"""

import os

COMMAND = "ringfeed"


def _recorded():
    """The executable the installed distribution's RECORD lists, if this
    package is that distribution's."""
    try:
        from importlib import metadata
    except ImportError:  # pragma: no cover - Python < 3.8
        return None
    try:
        dist = metadata.distribution("ringfeed")
    except metadata.PackageNotFoundError:
        return None
    here = os.path.dirname(os.path.abspath(__file__))
    files = dist.files or []
    ours = any(
        f.name == "__init__.py" and os.path.dirname(os.path.abspath(str(dist.locate_file(f)))) == here for f in files
    )
    if not ours:
        return None
    for f in files:
        if f.name == COMMAND and len(f.parts) > 1 and f.parts[-2] in ("bin", "Scripts"):
            return os.path.abspath(str(dist.locate_file(f)))
    return None


def find():
    """Path of the ``ringfeed`` executable installed with this package;
    FileNotFoundError naming the fix when there is none (a checkout on
    PYTHONPATH, or a package installed without its wheel's script)."""
    path = _recorded()
    if path and os.path.isfile(path) and os.access(path, os.X_OK):
        return path
    raise FileNotFoundError(
        "ringfeed: the ringfeed command is not installed with this package (%s); install the ringfeed "
        "wheel (pip install ringfeed-VERSION-py3-none-manylinux_*.whl), or from a checkout: "
        "pip install ./bindings/python (builds it with cargo), or run target/release/ringfeed"
        % ("%s is missing" % path if path else "%s is not an installed distribution's" % os.path.dirname(os.path.abspath(__file__)))
    )
