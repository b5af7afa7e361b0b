"""Build hooks: bundle libringfeed.so inside the package, tag the wheel per platform.

The package has no compiled extension of its own; it ships the C library built
from the Rust workspace. Where that library comes from, first match wins:

1. ``RINGFEED_BUILD_LIB=/path/to/libringfeed.so``: a prebuilt library.
2. The Rust workspace two levels up (``../../``, or ``RINGFEED_REPO_ROOT``):
   ``cargo build --release -p ringfeed-ffi`` runs there (a no-op when up to
   date) and its ``target/release/libringfeed.so`` is copied.
3. A ``ringfeed/libringfeed.so`` already beside this file (an sdist made with it).

pip (>= 21.3) builds a local directory in place, so ``../../`` is the real
workspace; a build from an unpacked sdist elsewhere needs 1 or RINGFEED_REPO_ROOT.
"""

import json
import os
import shutil
import subprocess

from setuptools import Distribution, setup
from setuptools.command.build_py import build_py as _build_py

try:  # setuptools >= 70.1 ships bdist_wheel itself
    from setuptools.command.bdist_wheel import bdist_wheel as _bdist_wheel
except ImportError:  # pragma: no cover - older setuptools
    from wheel.bdist_wheel import bdist_wheel as _bdist_wheel

HERE = os.path.dirname(os.path.abspath(__file__))
LIB_NAME = "libringfeed.so"


def _repo_root():
    """The Rust workspace root, or None when this is not a checkout."""
    root = os.environ.get("RINGFEED_REPO_ROOT") or os.path.normpath(os.path.join(HERE, "..", ".."))
    if os.path.isfile(os.path.join(root, "Cargo.toml")) and os.path.isfile(os.path.join(root, "ffi", "Cargo.toml")):
        return root
    return None


def _target_dir(root):
    """Cargo's target directory (honours CARGO_TARGET_DIR and .cargo/config)."""
    try:
        out = subprocess.run(
            ["cargo", "metadata", "--format-version", "1", "--no-deps"],
            cwd=root,
            check=True,
            stdout=subprocess.PIPE,
        ).stdout
        return json.loads(out)["target_directory"]
    except (OSError, subprocess.CalledProcessError, ValueError, KeyError):
        return os.environ.get("CARGO_TARGET_DIR") or os.path.join(root, "target")


def _cargo_build(root):
    """Builds the C library in the workspace; returns its path."""
    cmd = ["cargo", "build", "--release", "-p", "ringfeed-ffi"]
    try:
        subprocess.run(cmd, cwd=root, check=True)
    except OSError as e:
        raise SystemExit(
            "ringfeed: cannot run %s (%s); install Rust (https://rustup.rs) or set "
            "RINGFEED_BUILD_LIB to a prebuilt libringfeed.so" % (" ".join(cmd), e)
        )
    except subprocess.CalledProcessError as e:
        raise SystemExit("ringfeed: `%s` failed in %s (exit %d)" % (" ".join(cmd), root, e.returncode))
    path = os.path.join(_target_dir(root), "release", LIB_NAME)
    if not os.path.isfile(path):
        raise SystemExit("ringfeed: cargo succeeded but %s does not exist" % path)
    return path


def _library_source():
    """Path of the libringfeed.so to bundle (see the module docstring)."""
    prebuilt = os.environ.get("RINGFEED_BUILD_LIB")
    if prebuilt:
        if not os.path.isfile(prebuilt):
            raise SystemExit("ringfeed: RINGFEED_BUILD_LIB=%s is not a file" % prebuilt)
        return os.path.abspath(prebuilt)
    root = _repo_root()
    if root is not None:
        return _cargo_build(root)
    beside = os.path.join(HERE, "ringfeed", LIB_NAME)
    if os.path.isfile(beside):
        return beside
    raise SystemExit(
        "ringfeed: no libringfeed.so to bundle: %s is not inside the ringfeed workspace; set "
        "RINGFEED_BUILD_LIB=/path/to/libringfeed.so or RINGFEED_REPO_ROOT=/path/to/ringfeed" % HERE
    )


class build_py(_build_py):
    """Copies libringfeed.so into the built package (into the source tree for
    editable installs)."""

    def run(self):
        super().run()
        src = _library_source()
        if getattr(self, "editable_mode", False):
            dest_dir = os.path.join(HERE, "ringfeed")
        else:
            dest_dir = os.path.join(self.build_lib, "ringfeed")
        os.makedirs(dest_dir, exist_ok=True)
        dest = os.path.join(dest_dir, LIB_NAME)
        if os.path.abspath(src) != os.path.abspath(dest):
            self.announce("ringfeed: bundling %s" % src, level=2)
            shutil.copyfile(src, dest)
            os.chmod(dest, 0o755)


class BinaryDistribution(Distribution):
    """Installs into platlib (the wheel's root), as a package with native code."""

    def has_ext_modules(self):
        return True


class bdist_wheel(_bdist_wheel):
    """A platform wheel (it carries a native library), for any Python 3."""

    def finalize_options(self):
        super().finalize_options()
        self.root_is_pure = False

    def get_tag(self):
        _, _, plat = super().get_tag()
        return "py3", "none", plat


setup(distclass=BinaryDistribution, cmdclass={"build_py": build_py, "bdist_wheel": bdist_wheel})
