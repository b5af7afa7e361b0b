"""Build hooks: one platform wheel with the `ringfeed` command and libringfeed.so.

The package has no compiled extension of its own; it ships what the Rust
workspace builds: ``libringfeed.so`` inside the package (the ctypes binding
loads it) and the ``ringfeed`` executable as the wheel's script (pip puts it
in the environment's ``bin/``, beside ``python``). Build it with::

    pip wheel --no-deps ./bindings/python -w dist      # from a checkout; needs cargo

Where the two files come from, first match wins, each on its own:

1. ``RINGFEED_BUILD_LIB=/path/to/libringfeed.so`` and
   ``RINGFEED_BUILD_BIN=/path/to/ringfeed``: prebuilt files.
2. The Rust workspace: ``RINGFEED_REPO_ROOT``, else the checkout two levels up
   (``../../``), else ``rust/`` beside this file (an sdist carries the
   workspace there). ``cargo build --release --locked -p ringfeed-ffi -p
   ringfeed`` runs in it (a no-op when up to date).
3. ``ringfeed/libringfeed.so`` beside this file (left by an editable install).

pip shows nothing of a build backend's output (but with ``-v``), and cargo's
first build takes minutes: so the stages, and cargo's own progress, go to the
terminal pip runs in (``/dev/tty``) when there is one, else to stderr (which
pip shows with ``-v`` or when the build fails). ``RINGFEED_BUILD_QUIET=1``
keeps them off the terminal.

The version is the workspace's (``[workspace.package]`` in its Cargo.toml),
the one the crates and ``ringfeed --version`` have. The platform tag is
``manylinux_2_X_<arch>``, X the newest ``GLIBC_2.X`` symbol version that the
two binaries need (``objdump -T``), when they link nothing outside the
manylinux set of libraries; else the plain ``linux_<arch>``.
"""

import json
import os
import re
import runpy
import shutil
import subprocess
import sys
import sysconfig
import time

from setuptools import Distribution, setup
from setuptools.command.build_py import build_py as _build_py
from setuptools.command.sdist import sdist as _sdist

# distutils is setuptools' own once setuptools is imported (Python 3.12 has no other).
from distutils.command.build_scripts import build_scripts as _build_scripts  # noqa: E402

try:  # setuptools >= 70.1 ships bdist_wheel itself
    from setuptools.command.bdist_wheel import bdist_wheel as _bdist_wheel
except ImportError:  # pragma: no cover - older setuptools
    from wheel.bdist_wheel import bdist_wheel as _bdist_wheel

HERE = os.path.dirname(os.path.abspath(__file__))
LIB_NAME = "libringfeed.so"
BIN_NAME = "ringfeed"
# The parts of the workspace an sdist carries to build both files (engine's
# [[bench]] and [[example]] targets name files in bench/).
WORKSPACE_PARTS = ["Cargo.toml", "Cargo.lock", "engine", "ffi", "tests/faultproxy"]
WORKSPACE_GLOBS = [("bench", ".rs")]
# Libraries every manylinux policy allows a wheel to link (PEP 599/600).
MANYLINUX_LIBS = {
    "libc.so.6", "libm.so.6", "libgcc_s.so.1", "libpthread.so.0", "libdl.so.2", "librt.so.1",
    "libutil.so.1", "ld-linux-x86-64.so.2", "ld-linux-aarch64.so.1",
}

cargo_version = runpy.run_path(os.path.join(HERE, "ringfeed", "_version.py"))["cargo_version"]


def _is_workspace(root):
    return os.path.isfile(os.path.join(root, "Cargo.toml")) and os.path.isfile(os.path.join(root, "ffi", "Cargo.toml"))


def _repo_root():
    """The Rust workspace root, or None when there is none (see the module docstring)."""
    explicit = os.environ.get("RINGFEED_REPO_ROOT")
    if explicit:
        if not _is_workspace(explicit):
            raise SystemExit("ringfeed: RINGFEED_REPO_ROOT=%s is not the ringfeed workspace (no Cargo.toml and ffi/)" % explicit)
        return explicit
    for root in (os.path.normpath(os.path.join(HERE, "..", "..")), os.path.join(HERE, "rust")):
        if _is_workspace(root):
            return root
    return None


def _version():
    root = _repo_root()
    version = cargo_version(os.path.join(root, "Cargo.toml")) if root else None
    if version is None:
        raise SystemExit(
            "ringfeed: cannot tell the version: no Cargo.toml with [workspace.package] version at %s; "
            "build from a checkout or from the sdist (which carries the workspace in rust/)" % (root or HERE)
        )
    return version


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


_built = {}


def _terminal():
    """The terminal pip runs in, open for writing, or None (no controlling
    terminal, as in CI, or RINGFEED_BUILD_QUIET=1): pip hides a build's
    output, and a person waiting minutes for cargo should see it work."""
    if os.environ.get("RINGFEED_BUILD_QUIET") == "1":
        return None
    try:
        return open("/dev/tty", "w")  # noqa: SIM115 - closed by the caller
    except OSError:
        return None


def _say(tty, text):
    """One line about a stage: on the terminal if there is one, and on
    stderr (pip's log) either way."""
    print(text, file=sys.stderr, flush=True)
    if tty is not None:
        try:
            tty.write("\r\n%s\n" % text)
            tty.flush()
        except OSError:
            pass


def _cargo_build(root):
    """Builds both files in the workspace once; returns {name: path}."""
    if _built:
        return _built
    cmd = ["cargo", "build", "--release", "--locked", "-p", "ringfeed-ffi", "-p", "ringfeed"]
    if shutil.which("cargo") is None:
        raise SystemExit(
            "ringfeed: building from source needs Rust's cargo on PATH, and there is none: install Rust "
            "(https://rustup.rs) and build again, or install the prebuilt wheel instead "
            "(pip install ringfeed-VERSION-py3-none-manylinux_*.whl), or point RINGFEED_BUILD_LIB and "
            "RINGFEED_BUILD_BIN at a prebuilt libringfeed.so and ringfeed"
        )
    tty = _terminal()
    started = time.monotonic()
    _say(tty, "ringfeed: building libringfeed.so and the ringfeed command: %s in %s (a first build takes "
              "several minutes; later ones seconds)" % (" ".join(cmd), root))
    try:
        # On a terminal cargo draws its own progress bar there.
        subprocess.run(cmd, cwd=root, check=True, stderr=tty)
    except OSError as e:
        raise SystemExit("ringfeed: cannot run %s in %s: %s" % (" ".join(cmd), root, e))
    except subprocess.CalledProcessError as e:
        raise SystemExit("ringfeed: `%s` failed in %s (exit %d)" % (" ".join(cmd), root, e.returncode))
    else:
        _say(tty, "ringfeed: cargo finished in %.0f s; packing the wheel" % (time.monotonic() - started))
    finally:
        if tty is not None:
            tty.close()
    release = os.path.join(_target_dir(root), "release")
    for name in (LIB_NAME, BIN_NAME):
        path = os.path.join(release, name)
        if not os.path.isfile(path):
            raise SystemExit("ringfeed: cargo succeeded but %s does not exist" % path)
        _built[name] = path
    return _built


def _artifact(name, env):
    """Path of the file ``name`` to ship (see the module docstring)."""
    prebuilt = os.environ.get(env)
    if prebuilt:
        if not os.path.isfile(prebuilt):
            raise SystemExit("ringfeed: %s=%s is not a file" % (env, prebuilt))
        return os.path.abspath(prebuilt)
    root = _repo_root()
    if root is not None:
        return _cargo_build(root)[name]
    beside = os.path.join(HERE, "ringfeed", name)
    if name == LIB_NAME and os.path.isfile(beside):
        return beside
    raise SystemExit(
        "ringfeed: no %s to ship: %s is neither a checkout nor an sdist with the workspace in rust/; set "
        "%s=/path/to/%s or RINGFEED_REPO_ROOT=/path/to/ringfeed" % (name, HERE, env, name)
    )


def _copy_executable(src, dest, announce):
    if os.path.abspath(src) != os.path.abspath(dest):
        announce("ringfeed: shipping %s as %s" % (src, dest), level=2)
        os.makedirs(os.path.dirname(dest), exist_ok=True)
        shutil.copyfile(src, dest)
    os.chmod(dest, 0o755)


# What went into the wheel, for the platform tag.
_shipped = []


class build_py(_build_py):
    """Copies libringfeed.so into the built package (into the source tree for
    editable installs), and writes the version into the built _version.py."""

    def run(self):
        super().run()
        src = _artifact(LIB_NAME, "RINGFEED_BUILD_LIB")
        editable = getattr(self, "editable_mode", False)
        dest_dir = os.path.join(HERE if editable else self.build_lib, "ringfeed")
        dest = os.path.join(dest_dir, LIB_NAME)
        _copy_executable(src, dest, self.announce)
        _shipped.append(dest)
        if not editable:
            with open(os.path.join(dest_dir, "_version.py"), "w", encoding="utf-8") as f:
                f.write('"""Written by setup.py from the workspace\'s Cargo.toml."""\n\n__version__ = %r\n' % _version())


class build_scripts(_build_scripts):
    """The one script is the `ringfeed` executable, copied as it is (the
    stock command reads each script as Python text)."""

    def get_source_files(self):
        return []

    def run(self):
        dest = os.path.join(self.build_dir, BIN_NAME)
        _copy_executable(_artifact(BIN_NAME, "RINGFEED_BUILD_BIN"), dest, self.announce)
        _shipped.append(dest)


class sdist(_sdist):
    """Carries the Rust workspace in ``rust/``, so that the sdist builds both
    files from source (with cargo) wherever it is unpacked."""

    def make_release_tree(self, base_dir, files):
        super().make_release_tree(base_dir, files)
        root = _repo_root()
        if root is None:
            raise SystemExit("ringfeed: an sdist is made from a checkout (it carries the Rust workspace)")
        ignore = shutil.ignore_patterns("target", "__pycache__", "*.pyc")
        dest = os.path.join(base_dir, "rust")
        for part in WORKSPACE_PARTS:
            src = os.path.join(root, part)
            out = os.path.join(dest, part)
            os.makedirs(os.path.dirname(out), exist_ok=True)
            if os.path.isdir(src):
                shutil.copytree(src, out, ignore=ignore, dirs_exist_ok=True)
            else:
                shutil.copyfile(src, out)
        for folder, suffix in WORKSPACE_GLOBS:
            os.makedirs(os.path.join(dest, folder), exist_ok=True)
            for name in sorted(os.listdir(os.path.join(root, folder))):
                if name.endswith(suffix):
                    shutil.copyfile(os.path.join(root, folder, name), os.path.join(dest, folder, name))


def _objdump(flag, path):
    return subprocess.run(["objdump", flag, path], check=True, stdout=subprocess.PIPE, universal_newlines=True).stdout


def platform_tag(paths):
    """``manylinux_2_X_<arch>`` for the ELF files ``paths`` (see the module
    docstring), or ``linux_<arch>`` (and why) when that cannot be said."""
    plat = sysconfig.get_platform().replace("-", "_").replace(".", "_")
    if not plat.startswith("linux_"):
        return plat, "not Linux"
    arch = plat[len("linux_"):]
    newest = None
    for path in paths:
        try:
            symbols, headers = _objdump("-T", path), _objdump("-p", path)
        except (OSError, subprocess.CalledProcessError) as e:
            return plat, "objdump (binutils) could not read %s: %s" % (path, e)
        foreign = set(re.findall(r"^\s*NEEDED\s+(\S+)", headers, re.M)) - MANYLINUX_LIBS
        if foreign:
            return plat, "%s links %s, outside the manylinux set" % (path, ", ".join(sorted(foreign)))
        for major, minor in re.findall(r"\bGLIBC_(\d+)\.(\d+)", symbols):
            newest = max(newest or (0, 0), (int(major), int(minor)))
    if newest is None:
        return plat, "no GLIBC_ symbol versions (not glibc?)"
    return "manylinux_%d_%d_%s" % (newest[0], newest[1], arch), "needs glibc %d.%d" % newest


class BinaryDistribution(Distribution):
    """Installs into platlib (the wheel's root), as a package with native code."""

    def has_ext_modules(self):
        return True


class bdist_wheel(_bdist_wheel):
    """A platform wheel (it carries native code), for any Python 3."""

    def finalize_options(self):
        super().finalize_options()
        self.root_is_pure = False

    def get_tag(self):
        if self.plat_name_supplied:
            return "py3", "none", super().get_tag()[2]
        if not _shipped:
            raise SystemExit("ringfeed: the platform tag is asked for before the binaries were built")
        tag, why = platform_tag(sorted(set(_shipped)))
        self.announce("ringfeed: platform tag %s (%s)" % (tag, why), level=2)
        return "py3", "none", tag


setup(
    version=_version(),
    scripts=[BIN_NAME],  # made by build_scripts above
    distclass=BinaryDistribution,
    cmdclass={"build_py": build_py, "build_scripts": build_scripts, "sdist": sdist, "bdist_wheel": bdist_wheel},
)
