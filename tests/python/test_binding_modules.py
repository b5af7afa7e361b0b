"""The Python package's modules depend on each other by interface: no module
imports or reads another module's underscore names (issue 28). The C library
is reached through one handle, ``_lib.LIB``."""
import ast
from pathlib import Path

import ringfeed

PACKAGE = Path(ringfeed.__file__).parent


def _crossings(path):
    """Every place ``path`` names another of the package's modules' private
    names: ``from ._x import _y`` or ``_x._y`` on a module it imported."""
    tree = ast.parse(path.read_text(), str(path))
    modules = set()  # names bound to sibling modules in this file
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            sibling = node.level == 1 or (node.module or "").split(".")[0] == "ringfeed"
            if not sibling:
                continue
            for alias in node.names:
                if node.module in (None, "ringfeed"):
                    modules.add(alias.asname or alias.name)  # from . import _lib
                elif alias.name.startswith("_") and not alias.name.startswith("__"):
                    found.append("%s:%d: from %s import %s" % (path.name, node.lineno, node.module, alias.name))
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("ringfeed.") and alias.asname:
                    modules.add(alias.asname)
    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in modules
                and node.attr.startswith("_") and not node.attr.startswith("__")):
            found.append("%s:%d: %s.%s" % (path.name, node.lineno, node.value.id, node.attr))
    return found


def test_no_module_of_the_package_reads_another_modules_private_names():
    files = sorted(PACKAGE.glob("*.py"))
    assert len(files) > 5, files
    found = [c for f in files for c in _crossings(f)]
    assert found == [], "modules of ringfeed reach into each other's private names:\n" + "\n".join(found)


def test_the_package_loads_the_library_once_through_one_handle():
    from ringfeed import _lib

    assert isinstance(_lib.LIB, _lib.Library)
    assert ringfeed.library_path == _lib.LIB.path
    assert _lib.LIB.has("rf_next") and not _lib.LIB.has("rf_no_such_function")
    assert int(_lib.LIB.rf_abi_version()) == ringfeed.abi_version()
