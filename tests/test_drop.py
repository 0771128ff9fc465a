"""`make drop EXTRA=<name>` (scripts/drop.py): for each extra, and for all of them dropped in turn, a copy of this
checkout (its tracked files, a git repository of its own) has the extra dropped. What is left must hold none of the
extra's paths or markers, no README line naming it, no make target of it, no import of a module that is gone, no
link to a page that is gone, and pass ruff. Whether what is left runs, with the extras' packages uninstalled too,
CI shows: .ci/run drops each extra, then all of them, and runs `make test-fast` there.

    .venv/bin/python -m pytest -q tests/test_drop.py
"""

from __future__ import annotations

import ast
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from scripts import drop
from tests.conftest import REPO

EXTRAS = drop.extras(REPO)
# What a README that still mentions an extra would say: its commands, make targets, pages, folders and presets.
MENTIONS = {
    "azure": ("Azure", "scripts.submit", "scripts.assets", "make submit", "make assets", "docs/azure-ml.md",
              "azure-ai-ml", "scripts/azure_ml"),
    "serving": ("scripts.serve", "scripts.score", "scripts.export", "make serve", "make export", "--register_model",
                "docs/serving.md", ".venv-serve", "spark_udf", "scripts/serving", "pyfunc"),
    "sweeps": ("sweep", "Sweep", "Optuna", "scripts/sweeps", "configs/sweeps"),
    "spark": ("spark", "Spark", "TorchDistributor", "Databricks"),
    "horovod": ("horovodrun", "make horovod", "configs/trainer/horovod.yaml", "build_horovod", "strategies/horovod"),
    "bench": ("make bench", "scripts.bench", "scripts/bench", "bench-gpu"),
}  # fmt: skip
TARGETS = {
    "azure": {"submit", "assets", "pipeline", "components", "deploy"},
    "serving": {"serve", "serve-env", "export", "pipeline", "components", "deploy", "bench-serve"},
    "sweeps": {"sweep"},
    "spark": {"spark", "bench-spark"},
    "horovod": {"horovod", "horovod-gpu"},
    "bench": {"bench", "bench-gpu", "bench-spark", "bench-serve"},
}
PACKAGES = ("scripts", "datamodules", "lightning_modules", "strategies", "tests")


def checkout_copy(folder: Path) -> Path:
    """This checkout's tracked files, as they are in the work tree, in a git repository of their own at `folder`."""
    listed = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True).stdout.decode()
    for name in filter(None, listed.split("\0")):
        if (REPO / name).is_file():
            (folder / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, folder / name)
    commit(folder, init=True)
    return folder


def commit(folder: Path, init: bool = False) -> None:
    git = ["git", "-c", "user.email=t@t", "-c", "user.name=t"]
    commands = ([["init", "-q"]] if init else []) + [["add", "-A"], ["commit", "-qm", "a drop", "--allow-empty"]]
    for command in commands:
        subprocess.run([*git, *command], cwd=folder, check=True, capture_output=True)


def dropped(folder: Path, *names: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "scripts.drop", *names], cwd=folder, capture_output=True, text=True)


def missing_imports(folder: Path) -> list[str]:
    """`file: module` for each import of a project module (at a file's top or in a function) that is not there."""
    found = []
    for path in (p for package in PACKAGES for p in (folder / package).rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [node.module]
            else:
                continue
            for name in (n for n in names if n.split(".")[0] in PACKAGES):
                base = folder.joinpath(*name.split("."))
                if not (base.with_suffix(".py").is_file() or (base / "__init__.py").is_file()):
                    found.append(f"{path.relative_to(folder)}: {name}")
    return found


def broken_links(folder: Path) -> list[str]:
    found = []
    for page in [folder / "README.md", *(folder / "docs").glob("*.md")]:
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", page.read_text()):
            if "://" not in target and not (page.parent / target).exists():
                found.append(f"{page.relative_to(folder)}: {target}")
    return found


def marked_lines(folder: Path, name: str) -> list[str]:
    """`file:line` of each marker of the extra `name` left in the tracked files."""
    listed = subprocess.run(["git", "ls-files", "-z"], cwd=folder, capture_output=True, check=True).stdout.decode()
    found = []
    for relative in filter(None, listed.split("\0")):
        try:
            lines = (folder / relative).read_text().splitlines()
        except (UnicodeDecodeError, FileNotFoundError):
            continue
        for number, line in enumerate(lines, 1):
            match = drop.MARKER.search(line)
            if match and name in re.split(r"[,\s]+", match[2]):
                found.append(f"{relative}:{number}")
    return found


def check_dropped(folder: Path, names: tuple[str, ...]) -> None:
    for name in names:
        assert not [path for path in EXTRAS[name] if (folder / path).exists()], name
        readme = folder.joinpath("README.md").read_text()
        assert not [word for word in MENTIONS[name] if word in readme], name
        targets = subprocess.run(["make", "-s", "help"], cwd=folder, capture_output=True, text=True).stdout
        assert not {line.split()[1] for line in targets.splitlines()} & TARGETS[name], name
        assert not marked_lines(folder, name), name
    project = tomllib.loads((folder / "pyproject.toml").read_text())
    assert not set(names) & set(project["project"]["optional-dependencies"])
    assert not set(names) & set(project["tool"]["template"]["extras"])
    assert missing_imports(folder) == []
    assert broken_links(folder) == []
    for check in (["check", "--quiet"], ["format", "--check", "--quiet"]):  # make lint's
        ruff = subprocess.run([str(Path(sys.executable).parent / "ruff"), *check, "."], cwd=folder,
                              capture_output=True, text=True)  # fmt: skip
        assert ruff.returncode == 0, ruff.stdout[-3000:]


if EXTRAS:  # a project with every extra dropped has none to drop (pytest would report an empty parameter set skipped)

    @pytest.mark.parametrize("name", sorted(EXTRAS))
    def test_dropping_an_extra_leaves_nothing_of_it_and_nothing_broken(tmp_path, name):
        folder = checkout_copy(tmp_path / "repo")
        done = dropped(folder, name)
        assert done.returncode == 0, done.stderr
        assert f"removed {name}'s paths" in done.stdout
        check_dropped(folder, (name,))


@pytest.mark.slow
def test_every_extra_dropped_in_turn_leaves_the_core(tmp_path):
    folder = checkout_copy(tmp_path / "repo")
    for name in sorted(EXTRAS):
        done = dropped(folder, name)
        assert done.returncode == 0, done.stderr
        commit(folder)  # a drop needs a work tree without changes
    check_dropped(folder, tuple(sorted(EXTRAS)))
    assert (folder / "scripts" / "drop.py").is_file()  # the core keeps its own tool


def test_the_checkout_s_own_imports_and_links_are_whole():
    """The checks above on this checkout itself: they would find nothing to blame a drop for."""
    assert missing_imports(REPO) == [] and broken_links(REPO) == []


def test_a_drop_refuses_uncommitted_changes_and_an_unknown_extra_in_one_line(tmp_path):
    folder = checkout_copy(tmp_path / "repo")
    (folder / "README.md").write_text("mine\n")
    done = dropped(folder, "notebooks")  # the clean check comes first: it holds with every extra dropped too
    assert done.returncode == 1 and done.stderr == (
        "error: uncommitted changes (README.md and others): commit or stash them first, so the drop can be undone\n"
    )
    status = subprocess.run(["git", "status", "--porcelain"], cwd=folder, capture_output=True, text=True).stdout
    assert status == " M README.md\n"  # nothing removed, the change kept
    commit(folder)
    done = dropped(folder, "notebooks")
    assert done.returncode == 1 and done.stderr.startswith("error: EXTRA=notebooks: no such extra in pyproject.toml")


@pytest.mark.parametrize(
    ("text", "names", "kept"),
    [
        ("a\nb  # extra: spark\nc\n", {"spark"}, "a\nc\n"),
        ("a\nb  # extra: spark\nc\n", {"serving"}, "a\nb  # extra: spark\nc\n"),
        ("a\nb  # extra: azure, serving\n", {"serving"}, "a\n"),
        ("a\n# extra: sweeps\nb\n# extra: azure\nc\n# end extra: azure\n# end extra: sweeps\nd\n", {"sweeps"},
         "a\nd\n"),
        ("a\n# extra: sweeps\nb\n# extra: azure\nc\n# end extra: azure\n# end extra: sweeps\nd\n", {"azure"},
         "a\n# extra: sweeps\nb\n# end extra: sweeps\nd\n"),
        ("x <!-- extra: bench -->\n<!-- extra: bench -->\ny\n<!-- end extra: bench -->\nz\n", {"bench"}, "z\n"),
        ("the words extra: spark in a sentence.\n", {"spark"}, "the words extra: spark in a sentence.\n"),
        # The blank lines that separated what went from what follows go with it; none is left at the end.
        ("a\n\n\n# extra: s\ndef f():\n    pass\n\n\n# end extra: s\n\n\nb\n", {"s"}, "a\n\n\nb\n"),
        ("a\n\n\n# extra: s\nb\n# end extra: s\n", {"s"}, "a\n"),
        ("a\nb  # extra: s\n\nc\n", {"s"}, "a\n\nc\n"),
    ],
)  # fmt: skip
def test_marked_lines_and_blocks_go_with_their_extra(text, names, kept):
    assert drop.drop_lines(text, names, "f")[0] == kept


@pytest.mark.parametrize(
    ("text", "line"),
    [
        ("a\n# extra: spark\nb\n", "f: the block of `extra: spark` has no `end extra` line"),
        ("a\n# end extra: spark\n", "f:2: `end extra: spark` closes no block of those extras"),
    ],
)
def test_an_unclosed_or_unopened_block_is_one_line_naming_the_file(text, line):
    with pytest.raises(drop.DropError) as error:
        drop.drop_lines(text, {"spark"}, "f")
    assert str(error.value) == line
