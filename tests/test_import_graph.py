"""The modules of the aligner package import each other without a circle (issue 53).

The graph is read from the source (ast), not by importing: an edge A -> B for every
``import B`` / ``from B import name`` in A that names a module of the package. Outside
aligner/training/ only the imports that run when A is imported count (module level, not under
``if TYPE_CHECKING``); inside aligner/training/ every import counts, those inside functions and
under TYPE_CHECKING too, so that its levels (the request types, one model directory, the
rounds, the builder, the alignment layer's stages) stay one above the other instead of a
circle kept working by imports deferred into functions.

aligner/links/ (links and their files' arithmetic) never imports torch, not even inside a
function: `align symmetrize` and `align score-aer` start without it.
"""
from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Set

PACKAGE = Path(__file__).resolve().parents[1] / "aligner"
#: the subpackage whose every import counts
STRICT = "aligner.training"


def module_names() -> Dict[str, Path]:
    """Dotted name -> file of every module of the package (a package: its __init__.py)."""
    names = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        names[".".join(parts)] = path
    return names


def _type_checking(node: ast.If) -> bool:
    test = node.test
    return ((isinstance(test, ast.Name) and test.id == "TYPE_CHECKING")
            or (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"))


def _module_level(body: List[ast.stmt]) -> Iterator[ast.stmt]:
    """The import statements that run on import: module level, also in if/try blocks, not
    under `if TYPE_CHECKING` nor in functions or classes."""
    for node in body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        elif isinstance(node, ast.If) and not _type_checking(node):
            yield from _module_level(node.body + node.orelse)
        elif isinstance(node, ast.Try):
            yield from _module_level(node.body + node.orelse + node.finalbody
                                     + [s for h in node.handlers for s in h.body])


def imports(name: str, path: Path, modules: Set[str]) -> Set[str]:
    """The package's modules that module `name` imports (see the module docstring)."""
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    strict = name == STRICT or name.startswith(STRICT + ".")
    nodes = ([n for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))]
             if strict else list(_module_level(tree.body)))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in nodes:
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        else:
            base: Optional[str] = node.module
            if node.level:   # relative: from the importing module's package up
                anchor = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([node.module] if node.module else []))
            # `from P import m`: the module P.m where it is one, else P itself
            targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base
                       for alias in node.names]
        found.update(target for target in targets if target in modules and target != name)
    return found


def import_graph() -> Dict[str, Set[str]]:
    modules = module_names()
    return {name: imports(name, path, set(modules)) for name, path in modules.items()}


def find_cycle(graph: Dict[str, Set[str]]) -> Optional[List[str]]:
    """One circle of `graph` (its modules in order, the first again at the end), or None."""
    state: Dict[str, int] = {}   # 1: on the current path, 2: done
    path: List[str] = []

    def visit(node: str) -> Optional[List[str]]:
        state[node] = 1
        path.append(node)
        for target in sorted(graph[node]):
            if state.get(target) == 1:
                return path[path.index(target):] + [target]
            if target not in state:
                cycle = visit(target)
                if cycle:
                    return cycle
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state:
            cycle = visit(node)
            if cycle:
                return cycle
    return None


def test_the_finder_sees_circles():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": set()}) is None


def test_function_level_imports_count_in_training():
    """The reader sees what the strict rule is for: an import inside a function."""
    graph = import_graph()
    assert "aligner.training.run" in graph["aligner.training.rounds"]
    assert "aligner.training.request" in graph["aligner.training.run"]
    # the levels: one model directory never reaches up to the rounds or the layer's stages
    assert not graph["aligner.training.run"] & {"aligner.training.rounds",
                                                "aligner.training.recipe_guide",
                                                "aligner.training.builder"}
    assert not graph["aligner.training.rounds"] & {"aligner.training.recipe_guide",
                                                   "aligner.training.builder"}


def test_the_package_imports_without_a_circle():
    cycle = find_cycle(import_graph())
    assert cycle is None, "import circle: " + " -> ".join(cycle)


#: the levels of aligner/training/, bottom to top
LEVELS = ("request", "run", "rounds", "builder", "recipe_guide")


def test_every_level_imports_first_in_a_fresh_interpreter():
    """Each level of aligner/training/ imported first, in an interpreter of its own: a circle
    of module-level imports would stop one of them half-initialized."""
    names = [f"{STRICT}.{level}" for level in LEVELS]
    script = ("import subprocess, sys\n"
              "for name in sys.argv[1:]:\n"
              "    subprocess.run([sys.executable, '-c', f'import {name}'], check=True)\n")
    result = subprocess.run([sys.executable, "-c", script, *names], capture_output=True,
                            text=True, cwd=PACKAGE.parent)
    assert result.returncode == 0, result.stderr


#: the subpackage that never imports torch
TORCH_FREE = "aligner.links"


def _all_imported_names(path: Path) -> Set[str]:
    """Every module name an import statement of the file names (functions included)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module)
    return names


def test_links_never_import_torch_nor_what_does():
    """No import in aligner/links/, inside functions too, names torch or a module of the
    package outside aligner/links/ other than the torch-free floor (formats, utils, constants)."""
    floor = {"aligner", "aligner.formats", "aligner.utils", "aligner.constants"}
    modules = module_names()
    links = {name: path for name, path in modules.items()
             if name == TORCH_FREE or name.startswith(TORCH_FREE + ".")}
    assert {"aligner.links.symmetrize", "aligner.links.metrics"} <= set(links)
    for name, path in links.items():
        imported = _all_imported_names(path)
        assert not {n for n in imported if n == "torch" or n.startswith("torch.")}, name
        outside = {n for n in imported if n.startswith("aligner") and n not in floor
                   and not n.startswith(TORCH_FREE)}
        assert not outside, f"{name} imports {sorted(outside)}"


def test_links_and_the_scoring_commands_load_without_torch():
    """A fresh interpreter imports every module of aligner/links/ and the modules of `align
    score-aer` and `align symmetrize`, and runs both commands' --help: torch is not loaded."""
    names = sorted(name for name in module_names() if name.startswith(TORCH_FREE))
    script = ("import importlib, sys\n"
              "for name in sys.argv[1:]:\n"
              "    importlib.import_module(name)\n"
              "from aligner.cli import main\n"
              "for command in ('score-aer', 'symmetrize'):\n"
              "    try:\n"
              "        main([command, '--help'])\n"
              "    except SystemExit as exit:\n"
              "        assert not exit.code, exit.code\n"
              "assert 'torch' not in sys.modules, 'torch was imported'\n")
    result = subprocess.run([sys.executable, "-c", script, *names, "aligner.cli.score_aer",
                             "aligner.cli.symmetrize", "aligner.extract.link_probs"],
                            capture_output=True, text=True, cwd=PACKAGE.parent)
    assert result.returncode == 0, result.stderr
