"""``python -m ringfeed ARGS``: runs the ``ringfeed`` command installed with
this package, as ``ringfeed ARGS`` does (the process becomes the command).

``python -m`` puts the working directory first on ``sys.path``: in a
directory another user can write to, their ``ringfeed/`` (or a module named
like one of the standard library's) runs instead, as you. Only that user's
code would run then, so this one can only warn when the directory is such a
place: on shared machines run ``ringfeed``, or ``python -P -m ringfeed``
(Python 3.11+), which leaves the working directory out (docs/install.md)."""

import os
import stat
import sys

from ._command import find


def _others_may_write(path):
    """Whether a user other than this one (or root) may put files in `path`."""
    try:
        st = os.stat(path)
    except OSError:
        return False
    if st.st_uid not in (0, os.geteuid()):
        return True
    return bool(st.st_mode & (stat.S_IWGRP | stat.S_IWOTH))


def _warn_if_path_is_shared():
    """Says so when the working directory is first on sys.path and others may write to it."""
    if getattr(sys.flags, "safe_path", False):
        return
    cwd = os.getcwd()
    first = os.path.abspath(sys.path[0]) if sys.path else None
    if first == cwd and _others_may_write(cwd):
        sys.stderr.write(
            "ringfeed: warning: `python -m ringfeed` ran in %s, which other users can write to: Python imports "
            "from the working directory first, so a ringfeed/ (or os.py, json.py...) put there would run instead, "
            "as you; on a shared machine run `ringfeed` (or `python -P -m ringfeed`)\n" % cwd
        )


def main():
    """Replaces this process with the ringfeed command and the same arguments."""
    _warn_if_path_is_shared()
    try:
        path = find()
    except FileNotFoundError as e:
        sys.stderr.write("%s\n" % e)
        return 127
    os.execv(path, [path] + sys.argv[1:])
    return 127  # not reached: execv returns only by raising


if __name__ == "__main__":
    sys.exit(main())
