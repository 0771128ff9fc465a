"""Drop an extra the team does not use: its folders, tests, configs, docs, make targets and pyproject extra, so that
the rest of the template, which still passes `make test-fast`, is all that is left to read and keep up to date.

    make drop EXTRA=spark              # or: python -m scripts.drop spark
    make drop EXTRA="sweeps bench"     # several, in turn

What each extra owns is in pyproject.toml, `[tool.template.extras]`: the folders and files removed whole. Lines of
other files that belong to an extra carry a marker, removed with it:

    a line ending in `# extra: spark` (or `<!-- extra: spark -->` in Markdown)      that line;
    a line `# extra: spark` alone ... a line `# end extra: spark` (`<!-- ... -->`)  the lines between, and both.

A marker may name several extras (`# extra: azure, sweeps`): the line goes with any of them. The work tree must have
no uncommitted changes (what is removed can then be had back from git). `make drop` then re-resolves the lock without
the extra's packages (`make lock`). Standard library only: it runs before and after any drop, with any Python.
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# A marker: `# extra: a, b` or `<!-- extra: a, b -->`, at a line's end (that line) or alone (a block's start), and
# `# end extra: a, b` alone (the block's end).
MARKER = re.compile(r"(?:#|<!--)\s*(end )?extra:\s*([a-z][a-z, ]*?)\s*(?:-->)?\s*$")


class DropError(Exception):
    """A drop that cannot be done; the message says why and what to do."""


def extras(root: Path = ROOT) -> dict[str, list[str]]:
    """Each extra's own paths, from pyproject.toml."""
    config = tomllib.loads((root / "pyproject.toml").read_text())
    return config.get("tool", {}).get("template", {}).get("extras", {})


def drop_lines(text: str, names: set[str], where: str) -> tuple[str, int]:
    """`text` without the lines marked for any of `names`, and how many went."""
    kept, dropped, blocks = [], 0, []  # blocks: (its extras, whether it is dropped), innermost last
    closing = False  # just after dropped lines that followed a blank one: the blank lines after them go too
    for number, line in enumerate(text.splitlines(keepends=True), 1):
        match = MARKER.search(line)
        marked = set(re.split(r"[,\s]+", match[2].strip())) if match else set()
        alone = match is not None and not line[: match.start()].strip()
        inside = any(went for _, went in blocks)
        if match and alone and match[1]:  # a block's end
            if not blocks or blocks[-1][0] != marked:
                raise DropError(f"{where}:{number}: `end extra: {match[2]}` closes no block of those extras")
            blocks.pop()
        elif match and alone:  # a block's start
            blocks.append((marked, inside or bool(marked & names)))
        if inside or bool(marked & names) or any(went for _, went in blocks):
            dropped += 1
            closing = closing or not kept or not kept[-1].strip()
        elif closing and not line.strip():
            dropped += 1  # a blank line separated what went from what follows: the blank lines before it still do
        else:
            kept.append(line)
            closing = False
    if blocks:
        raise DropError(f"{where}: the block of `extra: {', '.join(sorted(blocks[-1][0]))}` has no `end extra` line")
    while dropped and kept and not kept[-1].strip():  # no blank lines left at the end of the file
        kept.pop()
    return "".join(kept), dropped


def tracked_files(root: Path) -> list[Path]:
    listed = subprocess.run(["git", "ls-files", "-z"], cwd=root, capture_output=True, check=True).stdout
    return [root / name for name in listed.decode().split("\0") if name]


def check_clean(root: Path) -> None:
    """Refuses a work tree with uncommitted changes: a drop removes files, and a change made there would be lost."""
    try:
        status = subprocess.run(["git", "status", "--porcelain"], cwd=root, capture_output=True, text=True, check=True)
    except (OSError, subprocess.CalledProcessError):
        raise DropError(
            f"{root}: not a git work tree; drop removes files: run it in a clone you can go back in"
        ) from None
    if status.stdout.strip():
        first = status.stdout.splitlines()[0][3:]
        raise DropError(
            f"uncommitted changes ({first} and others): commit or stash them first, so the drop can be undone"
        )


def drop(names: list[str], root: Path = ROOT) -> list[str]:
    """Removes the extras `names` from the checkout at `root`; returns what it did, a line each."""
    check_clean(root)
    owned = extras(root)
    unknown = [name for name in names if name not in owned]
    if unknown:
        listed = ", ".join(sorted(owned)) or "none are left"
        raise DropError(f"EXTRA={unknown[0]}: no such extra in pyproject.toml [tool.template.extras] ({listed})")
    done = []
    for name in names:
        for relative in owned[name]:
            path = root / relative
            if path.is_dir():
                shutil.rmtree(path)
            elif path.exists():
                path.unlink()
        done.append(f"removed {name}'s paths: {', '.join(owned[name])}")
    for path in tracked_files(root):
        if not path.is_file() or path.is_symlink():
            continue
        try:
            text = path.read_text()
        except UnicodeDecodeError:  # a binary file: no markers
            continue
        new, count = drop_lines(text, set(names), str(path.relative_to(root)))
        if count:
            path.write_text(new)
            done.append(f"{path.relative_to(root)}: {count} line(s)")
    return done


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("extras", nargs="+", help="the extras to drop (pyproject.toml [tool.template.extras])")
    args = parser.parse_args(argv)
    try:
        for line in drop(args.extras):
            print(line)
    except DropError as error:
        sys.exit(f"error: {error}")
    print(f"dropped {', '.join(args.extras)}: `make test-fast` checks what is left; `git diff` shows what went")


if __name__ == "__main__":
    main()
