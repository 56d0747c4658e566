"""
How jesync's modules import each other, read from their source: every
import points down.  No two modules import each other, through any chain;
the lock service and the connection layer name none of the layers built on
them (the protocols, cluster mode, the composition root, the clients).
Every import counts, wherever it is: at module level, inside a function,
under C{if TYPE_CHECKING:} (a cycle that only the type checker sees is
still two modules that cannot be read, or changed, one without the other).
(What importing a part of jesync drags in, in a fresh interpreter, is
L{tests.process.test_import_isolation}.)
"""

from __future__ import annotations

import ast
import tempfile
from pathlib import Path
from typing import Dict, Iterator, List, Mapping, Set

from twisted.trial.unittest import SynchronousTestCase

ROOT = Path(__file__).resolve().parents[2]


UPPER_LAYERS = ("jesync.protocols", "jesync.cluster", "jesync.http", "jesync.server", "jesync.tap", "jesync.client", "jesync.testing")
#: The lowest serving layers.
LOWER_LAYERS = ("jesync.connections", "jesync.service", "jesync.sessions")


def modules_of(package: Path) -> Dict[str, Path]:
    """Every module of the package at C{package}, by dotted name (a package by its own name)."""
    modules = {}
    for path in sorted(package.rglob("*.py")):
        parts = list(path.relative_to(package.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        modules[".".join(parts)] = path
    return modules


def imports_of(name: str, path: Path, modules: Mapping[str, Path]) -> Set[str]:
    """
    The modules of C{modules} that module C{name} imports, at any level of
    its source.  C{import a.b} imports C{a.b}; C{from a import b} imports
    C{a}, and C{a.b} too if that is a module (a package's face is run, and
    its submodule loaded).
    """

    def known(dotted: str) -> Iterator[str]:
        while dotted and dotted not in modules:
            dotted = dotted.rpartition(".")[0]
        if dotted:
            yield dotted

    found: Set[str] = set()
    is_package = path.name == "__init__.py"
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                found.update(known(alias.name))
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = name.split(".") if is_package else name.split(".")[:-1]
                base = base[: len(base) - node.level + 1]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            found.update(known(source))
            for alias in node.names:
                if f"{source}.{alias.name}" in modules:
                    found.add(f"{source}.{alias.name}")
    found.discard(name)
    return found


def import_graph(package: Path) -> Dict[str, Set[str]]:
    """Each module of the package at C{package}, and the package's modules it imports."""
    modules = modules_of(package)
    return {name: imports_of(name, path, modules) for name, path in modules.items()}


def cycles_of(graph: Mapping[str, Set[str]]) -> List[List[str]]:
    """
    The import cycles of C{graph}: each group of modules that reach each
    other (a strongly connected component of two or more), as one cycle
    through them, its first module repeated at its end.
    """
    order: Dict[str, int] = {}
    low: Dict[str, int] = {}
    stack: List[str] = []
    on_stack: Set[str] = set()
    groups: List[Set[str]] = []

    def visit(module: str) -> None:  # (Tarjan's algorithm; the graph is a few dozen modules deep at most)
        order[module] = low[module] = len(order)
        stack.append(module)
        on_stack.add(module)
        for imported in sorted(graph[module]):
            if imported not in order:
                visit(imported)
                low[module] = min(low[module], low[imported])
            elif imported in on_stack:
                low[module] = min(low[module], order[imported])
        if low[module] == order[module]:
            group = set()
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.add(member)
                if member == module:
                    break
            if len(group) > 1:
                groups.append(group)

    for module in sorted(graph):
        if module not in order:
            visit(module)
    return [cycle_through(graph, group) for group in groups]


def cycle_through(graph: Mapping[str, Set[str]], group: Set[str]) -> List[str]:
    """One cycle inside C{group} (modules that all reach each other), from its first module back to it."""
    start = min(group)
    paths = {start: [start]}
    frontier = [start]
    while frontier:  # breadth first, so the cycle printed is a shortest one
        following = []
        for module in frontier:
            for imported in sorted(graph[module] & group):
                if imported == start:
                    return paths[module] + [start]
                if imported not in paths:
                    paths[imported] = paths[module] + [imported]
                    following.append(imported)
        frontier = following
    raise AssertionError(f"not a cycle: {sorted(group)}")


def reachable(graph: Mapping[str, Set[str]], module: str) -> Dict[str, List[str]]:
    """Every module C{module} imports, directly or not, with the chain of imports that reaches it."""
    chains = {module: [module]}
    frontier = [module]
    while frontier:
        following = []
        for current in frontier:
            for imported in sorted(graph[current]):
                if imported not in chains:
                    chains[imported] = chains[current] + [imported]
                    following.append(imported)
        frontier = following
    del chains[module]
    return chains


def within(module: str, prefixes: tuple[str, ...]) -> bool:
    return any(module == prefix or module.startswith(prefix + ".") for prefix in prefixes)


class ImportGraphTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.graph = import_graph(ROOT / "jesync")

    def test_no_import_cycle(self) -> None:
        """No module of jesync imports itself back, through any chain of imports."""
        cycles = list(cycles_of(self.graph))
        self.assertEqual(cycles, [], "import cycles:\n" + "\n".join(" -> ".join(cycle) for cycle in cycles))

    def test_the_lower_layers_import_nothing_above_them(self) -> None:
        """
        The connection layer, the lock service and its sessions import
        nothing, directly or not, from the protocols, cluster mode, the
        composition root or the clients.
        """
        lower = [module for module in self.graph if within(module, LOWER_LAYERS)]
        self.assertIn("jesync.connections.connection", lower)
        self.assertIn("jesync.service", lower)
        upward = [
            " -> ".join(chain)
            for module in lower
            for imported, chain in reachable(self.graph, module).items()
            if within(imported, UPPER_LAYERS)
        ]
        self.assertEqual(upward, [], "imports that point up:\n" + "\n".join(upward))

    def test_nothing_in_jesync_imports_the_test_harness(self) -> None:
        """L{jesync.testing} sits at the top: no module of jesync imports it (what none imports, none reaches)."""
        self.assertEqual(sorted(module for module, imported in self.graph.items() if "jesync.testing" in imported), [])

    def test_the_walk_sees_every_kind_of_import(self) -> None:
        """
        The walk finds a cycle however it is made: through a function's
        import, a TYPE_CHECKING import, a relative import, or a package's
        face imported back by its own submodule.
        """
        sources = {
            "top/__init__.py": "from top.sub import Thing\n",
            "top/sub.py": "from top import helper\n",
            "top/helper.py": "def f():\n    from . import late\n",
            "top/late.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import top.lower.deep\n",
            "top/lower/__init__.py": "",
            "top/lower/deep.py": "from ..late import x\n",
            "top/alone.py": "import top.lower\n",
        }
        with tempfile.TemporaryDirectory() as directory:
            for name, source in sources.items():
                path = Path(directory, name)
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(source)
            graph = import_graph(Path(directory, "top"))
        self.assertEqual(graph["top.sub"], {"top", "top.helper"})
        self.assertEqual(graph["top.helper"], {"top", "top.late"})
        self.assertEqual(graph["top.late"], {"top.lower.deep"})
        self.assertEqual(graph["top.lower.deep"], {"top.late"})
        self.assertEqual(
            sorted(cycles_of(graph)),
            [["top", "top.sub", "top"], ["top.late", "top.lower.deep", "top.late"]],
        )
        self.assertEqual(reachable(graph, "top.alone"), {"top.lower": ["top.alone", "top.lower"]})


class TestModuleImportTests(SynchronousTestCase):
    def test_no_test_module_imports_another(self) -> None:
        """A test module imports its helpers from the modules at tests/ top level, never from a test module."""
        found = []
        for path in sorted((ROOT / "tests").rglob("test_*.py")):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, ast.ImportFrom):
                    names = [f"{node.module or ''}.{alias.name}" for alias in node.names]
                elif isinstance(node, ast.Import):
                    names = [alias.name for alias in node.names]
                else:
                    continue
                found += [
                    f"{path.relative_to(ROOT)}:{node.lineno}: {name}"
                    for name in names
                    if any(part.startswith("test_") for part in name.split("."))
                ]
        self.assertEqual(found, [])
