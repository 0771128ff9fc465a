"""The job's code folder as Azure ML uploads it, copied to a temporary folder, for scripts.submit to hand to the SDK.

    with code_snapshot(Path.cwd()) as code:
        job.code = str(code)
        client.jobs.create_or_update(job)

azure-ai-ml lists a code folder by walking every file in it, links followed, and testing each against .amlignore
(or .gitignore), several times a submission: with .venv's ~100,000 files inside the repository that takes ~10 s.
This walk skips an ignored folder whole, so it reads only the files that are uploaded. The copy holds the same files
under the same paths with the same bytes, so its content hash, by which Azure ML finds a snapshot it already has,
is the folder's own (tests/test_code_snapshot.py compares the two with the SDK's hash).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pathspec


def ignore_spec(folder: Path) -> pathspec.PathSpec:
    """The patterns of the folder's .amlignore, else its .gitignore, else none: the file Azure ML reads."""
    for name in (".amlignore", ".gitignore"):
        if (folder / name).is_file():
            return pathspec.PathSpec.from_lines("gitwildmatch", (folder / name).read_text().splitlines())
    return pathspec.PathSpec([])


def uploaded_files(folder: Path) -> list[str]:
    """The paths, relative to `folder`, of the files Azure ML uploads with it, sorted."""
    spec = ignore_spec(folder)
    # A folder can be skipped whole only when no later `!pattern` takes a file inside it back.
    prune = all(pattern.include is not False for pattern in spec.patterns)
    files = []
    for root, dirs, names in os.walk(folder, followlinks=True):
        relative = Path(root).relative_to(folder)
        if prune:
            dirs[:] = [name for name in dirs if not spec.match_file(f"{(relative / name).as_posix()}/")]
        files += [(relative / name).as_posix() for name in names if not spec.match_file((relative / name).as_posix())]
    return sorted(files)


@contextlib.contextmanager
def code_snapshot(folder: Path) -> Iterator[Path]:
    """A temporary copy of what Azure ML uploads of `folder` (hard links where the file system allows), removed
    on leaving the block."""
    with tempfile.TemporaryDirectory(prefix="code-") as temporary:
        snapshot = Path(temporary) / folder.resolve().name
        for name in uploaded_files(folder):
            target = snapshot / name
            target.parent.mkdir(parents=True, exist_ok=True)
            source = (folder / name).resolve()  # a link's target: the SDK uploads what a link points to
            try:
                os.link(source, target)
            except OSError:  # another file system
                shutil.copyfile(source, target)
        snapshot.mkdir(exist_ok=True)
        yield snapshot
