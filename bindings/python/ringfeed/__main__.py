"""``python -m ringfeed ARGS``: runs the ``ringfeed`` command installed with
this package, as ``ringfeed ARGS`` does (the process becomes the command)."""

import os
import sys

from ._command import find


def main():
    """Replaces this process with the ringfeed command and the same arguments."""
    try:
        path = find()
    except FileNotFoundError as e:
        sys.stderr.write("%s\n" % e)
        return 127
    os.execv(path, [path] + sys.argv[1:])
    return 127  # not reached: execv returns only by raising


if __name__ == "__main__":
    sys.exit(main())
