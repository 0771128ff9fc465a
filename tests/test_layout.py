"""The house rules, checked on the source: scripts/ has only commands at its top and one-line subpackages below,
imports point down without a cycle (read with ast, nothing executed), and the training path does not reach the
scoring script or export."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("scripts", "datamodules", "lightning_modules", "strategies")
LOWER = ("datamodules", "lightning_modules", "strategies")
COMMANDS = {"train", "plot", "checkpoint_of", "drop", "torchrun"}
COMMANDS |= {"submit", "assets"}  # extra: azure
COMMANDS |= {"pipeline", "deploy"}  # extra: azure, serving
COMMANDS |= {"serve", "score", "export"}  # extra: serving
COMMANDS |= {"sweep"}  # extra: sweeps
COMMANDS |= {"spark"}  # extra: spark
COMMANDS |= {"build_horovod"}  # extra: horovod
SUBPACKAGES = {"training"}
SUBPACKAGES |= {"serving"}  # extra: serving
SUBPACKAGES |= {"sweeps"}  # extra: sweeps
SUBPACKAGES |= {"azure_ml"}  # extra: azure
SUBPACKAGES |= {"bench"}  # extra: bench


def module_name(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def project_imports(path: Path, modules: set[str]) -> set[str]:
    """The project's modules `path` imports, at its top or inside a function: `from a.b import c` counts as a.b.c
    when that is a module, else a.b."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [f"{node.module}.{alias.name}" for alias in node.names] + [node.module]
        else:
            continue
        for name in names:
            while name and name not in modules:
                name = name.rpartition(".")[0]
            if name:
                found.add(name)
    return found


def import_graph() -> dict[str, set[str]]:
    paths = [path for package in PACKAGES for path in (REPO / package).rglob("*.py")]
    modules = {module_name(path) for path in paths}
    graph = {}
    for path in paths:
        name = module_name(path)
        # A package's __init__ is imported with each of its modules; ours hold only a docstring.
        graph[name] = {target for target in project_imports(path, modules) if target != name} - set(PACKAGES)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph.get(node, ())):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def reachable(graph: dict[str, set[str]], start: str) -> set[str]:
    seen, todo = set(), [start]
    while todo:
        node = todo.pop()
        if node not in seen:
            seen.add(node)
            todo += graph.get(node, ())
    return seen


def test_no_module_of_the_project_imports_itself_through_others():
    assert cycles(import_graph()) == []


def test_the_cycle_finder_names_a_cycle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(graph) == [["a", "b", "c"]]


def test_datamodules_networks_and_strategies_import_nothing_of_scripts_nor_of_each_other():
    for name, targets in import_graph().items():
        top = name.split(".")[0]
        if top in LOWER:
            assert {target.split(".")[0] for target in targets} <= {top}, name


def test_the_training_path_reaches_neither_the_scoring_script_nor_export():
    assert not {"scripts.score", "scripts.export", "scripts.serve"} & reachable(import_graph(), "scripts.train")


def test_scripts_holds_only_commands_at_its_top_and_one_line_packages_below():
    """A command is a module (scripts/<verb>.py) or, where it has modules of its own, a package run with -m
    (scripts/<verb>/__main__.py, its __init__ the command's main and public functions)."""
    commands = {path.parent.name for path in (REPO / "scripts").glob("*/__main__.py")}
    top = {path.stem for path in (REPO / "scripts").glob("*.py")} - {"__init__"}
    assert top | commands == COMMANDS and not top & commands
    for stem in top:
        text = (REPO / "scripts" / f"{stem}.py").read_text()
        assert "def main(" in text and 'if __name__ == "__main__":' in text, stem
    for name in commands:
        assert "def main(" in (REPO / "scripts" / name / "__init__.py").read_text(), name
    packages = [path.parent for path in (REPO / "scripts").glob("*/__init__.py") if path.parent.name not in commands]
    assert {package.name for package in packages} == SUBPACKAGES
    for package in packages:
        tree = ast.parse((package / "__init__.py").read_text())
        docstring = ast.get_docstring(tree)
        assert len(tree.body) == 1 and docstring and "\n" not in docstring, package.name


@pytest.mark.parametrize("graph", [{"a": {"b"}, "b": set()}, {"a": {"a"}}])
def test_the_cycle_finder_passes_a_graph_without_one(graph):
    assert cycles({name: targets - {name} for name, targets in graph.items()}) == []


def test_make_help_lines_up_every_target_description():
    import subprocess

    lines = subprocess.run(["make", "-s", "help"], cwd=REPO, capture_output=True, text=True, check=True).stdout
    lines = lines.splitlines()
    assert len(lines) >= 15 and any("test-fast" in line for line in lines)
    columns = {len(line) - len(line.split(None, 2)[2]) for line in lines}  # where each description starts
    assert len(columns) == 1, lines
