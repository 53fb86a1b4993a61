"""The layers of docs/architecture.md, held by reading the imports of every module in src/eaglespec.

A module imports only from its own layer and the layers below it, and no module imports, directly
or through others, a module that imports it back. Imports inside functions count as much as those
at the top of a file: a lazy import hides a circle from Python's import system, not from a reader.
"""

from __future__ import annotations

import ast
import importlib
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "eaglespec"

LAYERS = ("base", "core", "engine", "jobs", "entry")  # lowest first
# A module's layer is that of the longest name here it is, or sits under; the package root only
# by its exact name (every module sits under it).
LAYER_OF = {
    "eaglespec": "base", "eaglespec.errors": "base", "eaglespec.files": "base", "eaglespec.pause": "base",
    "eaglespec.memory": "base",
    "eaglespec.core": "core",
    "eaglespec.engine": "engine", "eaglespec.draft": "engine",
    "eaglespec.bench": "jobs", "eaglespec.interop": "jobs", "eaglespec.serve": "jobs", "eaglespec.train": "jobs",
    "eaglespec.tools": "jobs", "eaglespec.cli.options": "jobs", "eaglespec.cli.chat": "jobs",
    "eaglespec.cli": "entry",  # the package (it forwards the former cli.py's names), commands.py, __main__.py
}


def layer_of(module: str, table: dict[str, str] = LAYER_OF) -> str | None:
    if module in table:
        return table[module]
    owners = [name for name in table if "." in name and module.startswith(name + ".")]
    return table[max(owners, key=len)] if owners else None


def module_name(path: Path, root: Path = PACKAGE) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(source: str, module: str, is_package: bool, known: set[str]) -> set[str]:
    """The modules of ours that `source` (the text of `module`) imports anywhere in it: for
    `from X import y`, X.y where that is a module, else X."""
    package = module if is_package else module.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names if alias.name.split(".")[0] == "eaglespec"}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[:len(package.split(".")) - node.level + 1]
                name = ".".join(base + ([node.module] if node.module else []))
            else:
                name = node.module or ""
            if name.split(".")[0] != "eaglespec":
                continue
            for alias in node.names:
                found.add(f"{name}.{alias.name}" if f"{name}.{alias.name}" in known else name)
    return found - {module}


def package_graph(root: Path = PACKAGE) -> dict[str, set[str]]:
    """module -> the modules of ours it imports, for every .py file under `root`."""
    paths = {module_name(p, root): p for p in sorted(root.rglob("*.py"))}
    return {m: imports_of(p.read_text(), m, p.name == "__init__.py", set(paths)) for m, p in paths.items()}


def layer_problems(graph: dict[str, set[str]], table: dict[str, str] = LAYER_OF) -> list[str]:
    """One line per import from a higher layer, per module without a layer, and per import of
    a name that is no module of ours (a moved module's old name: src uses the new ones)."""
    problems = []
    for module, imported in sorted(graph.items()):
        own = layer_of(module, table)
        if own is None:
            problems.append(f"{module} has no layer: add it to LAYER_OF (and docs/architecture.md)")
            continue
        for other in sorted(imported):
            if other not in graph:
                problems.append(f"{module} imports {other}, which is no module of the package (an old name?)")
            elif (theirs := layer_of(other, table)) is not None and LAYERS.index(theirs) > LAYERS.index(own):
                problems.append(f"{module} ({own}) imports {other} ({theirs}), a higher layer")
    return problems


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Each import circle once, as the path [a, b, ..., a], found by depth-first search."""
    found, done, stack = [], set(), []
    on_stack: dict[str, int] = {}

    def visit(module: str) -> None:
        on_stack[module] = len(stack)
        stack.append(module)
        for other in sorted(graph.get(module, ())):
            if other in on_stack:
                found.append(stack[on_stack[other]:] + [other])
            elif other not in done and other in graph:
                visit(other)
        stack.pop()
        del on_stack[module]
        done.add(module)

    for module in sorted(graph):
        if module not in done:
            visit(module)
    return found


def test_the_checks_report_an_upward_import_and_a_circle():
    table = {"eaglespec.core": "core", "eaglespec.engine": "engine", "eaglespec.cli": "entry"}
    graph = {"eaglespec.core.tree": {"eaglespec.engine.batch"},           # upward
             "eaglespec.engine.batch": {"eaglespec.engine.target", "eaglespec.core.tree"},
             "eaglespec.engine.target": {"eaglespec.engine.batch"},       # a circle with batch
             "eaglespec.cli.main": {"eaglespec.engine.batch", "eaglespec.tree"},  # an old name
             "eaglespec.stray": set()}
    assert layer_problems(graph, table) == [
        "eaglespec.cli.main imports eaglespec.tree, which is no module of the package (an old name?)",
        "eaglespec.core.tree (core) imports eaglespec.engine.batch (engine), a higher layer",
        "eaglespec.stray has no layer: add it to LAYER_OF (and docs/architecture.md)"]
    assert cycles(graph) == [["eaglespec.engine.batch", "eaglespec.core.tree", "eaglespec.engine.batch"],
                             ["eaglespec.engine.batch", "eaglespec.engine.target", "eaglespec.engine.batch"]]


def test_the_reader_counts_function_level_and_relative_imports():
    source = ("from ..core import tree\nfrom . import target\nimport eaglespec.errors\nimport os\n"
              "def f():\n    from ..draft.heads import load_head\n    from .. import __version__\n")
    known = {"eaglespec", "eaglespec.core", "eaglespec.core.tree", "eaglespec.engine", "eaglespec.engine.target",
             "eaglespec.errors", "eaglespec.draft.heads", "eaglespec.engine.batch"}
    assert imports_of(source, "eaglespec.engine.batch", False, known) == {
        "eaglespec.core.tree", "eaglespec.engine.target", "eaglespec.errors", "eaglespec.draft.heads", "eaglespec"}


def test_every_module_imports_only_its_own_layer_and_those_below():
    assert layer_problems(package_graph()) == []


def test_no_import_circles():
    found = cycles(package_graph())
    assert not found, "import circles:\n" + "\n".join(" -> ".join(c) for c in found)


def test_a_package_init_imports_nothing_above_its_modules_at_load_time():
    """Importing a module runs its packages' __init__ first, so an __init__'s load-time imports
    are every one of its modules' imports: they must not climb above the lowest of them."""
    graph = package_graph()
    for init in PACKAGE.rglob("__init__.py"):
        package = module_name(init)
        top = ast.parse(init.read_text()).body  # load time: the module's own statements, not its functions
        imported = imports_of(ast.unparse(ast.Module([n for n in top if isinstance(n, (ast.Import, ast.ImportFrom))],
                                                     [])), package, True, set(graph))
        lowest = min((LAYERS.index(layer_of(m)) for m in graph if m.startswith(package + ".")), default=None)
        for other in imported:
            assert lowest is None or LAYERS.index(layer_of(other)) <= lowest, f"{package}/__init__.py imports {other}"


def test_old_import_paths_are_the_moved_modules():
    import eaglespec

    for old, new in eaglespec.MOVED.items():
        assert importlib.import_module(old) is importlib.import_module(new), old
        assert importlib.import_module(new).__name__ == new and importlib.import_module(new).__spec__.name == new
    from eaglespec.cli import load_generator, main
    from eaglespec.cli.commands import main as new_main
    from eaglespec.cli.options import load_generator as new_load_generator
    from eaglespec.decoding import EagleGenerator
    from eaglespec.engine.decoding import EagleGenerator as moved

    assert EagleGenerator is moved and main is new_main and load_generator is new_load_generator
    with pytest.raises(ImportError):
        from eaglespec.cli import no_such_name  # noqa: F401


def test_python_m_runs_a_moved_module_under_its_old_name():
    proc = subprocess.run([sys.executable, "-m", "eaglespec.device_check", "--help"], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0 and "--dry-run" in proc.stdout, proc.stderr
