"""The job's code folder as Azure ML uploads it, copied to a temporary folder, for scripts.submit to hand to the SDK.

    with code_snapshot(Path.cwd()) as code:
        job.code = str(code)
        client.jobs.create_or_update(job)

azure-ai-ml lists a code folder by walking every file in it, links followed, and testing each against .amlignore (or
.gitignore), several times a submission: with .venv's files inside the repository that takes seconds (docs/measured.md).
This walk skips an ignored folder whole, so it reads only the files that are uploaded. The copy holds the same files
under the same paths with the same bytes, so its content hash, by which Azure ML finds a snapshot it already has, is the
folder's own (tests/azure/test_code_snapshot.py compares the two with the SDK's hash).

What is left out is more than the SDK leaves out: what .amlignore leaves out, and also what .gitignore does (the SDK
reads only .amlignore when there is one, so a file a user keeps out of git would reach the workspace), and always
secrets and weights by their names (LEFT_OUT: a .env, keys, credentials.json, a stray best.ckpt or model.onnx), whatever
the ignore files say. The repository's .amlignore lists all of them too, for `az ml job create -f` of a --dry_run YAML,
which uploads through the SDK's own walk.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pathspec

# Never uploaded, whatever the ignore files say: secrets (environment files, keys, credentials: a service account's
# or an OAuth client's JSON by the names their consoles download them as, Kaggle's API token, package registries'
# tokens, a secrets file) and weights and stores (checkpoints, saved tensors, exported and pickled models, an MLflow or
# other SQLite store: a job writes its own to its outputs; one left in the code folder is hundreds of MB uploaded every
# time, and a job given one reads it as --inputs).
LEFT_OUT = (
    ".env", ".env.*", "*.pem", "*.key", "*.pfx", "*.p12", "id_rsa*", "id_ed25519*", ".netrc", ".git-credentials",
    ".databrickscfg", ".azure/", ".aws/", ".ssh/", ".kube/", ".docker/", "credentials.json", "*credentials*.json",
    "client_secret*.json", "service_account*.json", "service-account*.json", "kaggle.json", ".kaggle/", ".pypirc",
    ".npmrc", "secrets.yaml", "secrets.yml", "secrets.json", "secrets.toml", "*.ckpt", "*.pt", "*.pt2", "*.pth",
    "*.onnx", "*.safetensors", "*.pkl", "*.pickle", "*.joblib", "*.db", "*.sqlite", "*.sqlite3",
)  # fmt: skip
LARGE_FILE_BYTES = 10 * 2**20  # an uploaded file this large is named on stderr: data belongs in --inputs
named_large: set[str] = set()  # the large files named by this process (a local pipeline snapshots once a step)


def ignore_spec(folder: Path) -> pathspec.PathSpec:
    """The patterns of the folder's .amlignore, else its .gitignore, else none: the file Azure ML reads."""
    for name in (".amlignore", ".gitignore"):
        if (folder / name).is_file():
            return pathspec.PathSpec.from_lines("gitwildmatch", (folder / name).read_text().splitlines())
    return pathspec.PathSpec([])


def ignore_specs(folder: Path) -> list[pathspec.PathSpec]:
    """What leaves a file out (any one of them does): the file Azure ML reads, .gitignore, LEFT_OUT."""
    specs = [ignore_spec(folder), pathspec.PathSpec.from_lines("gitwildmatch", LEFT_OUT)]
    if (folder / ".amlignore").is_file() and (folder / ".gitignore").is_file():
        specs.append(pathspec.PathSpec.from_lines("gitwildmatch", (folder / ".gitignore").read_text().splitlines()))
    return specs


def uploaded_files(folder: Path) -> list[str]:
    """The paths, relative to `folder`, of the files uploaded with it, sorted."""
    specs = ignore_specs(folder)
    # A folder can be skipped whole by a file of patterns where no later `!pattern` takes a file inside it back.
    pruning = [spec for spec in specs if all(pattern.include is not False for pattern in spec.patterns)]
    files = []
    for root, dirs, names in os.walk(folder, followlinks=True):
        relative = Path(root).relative_to(folder)
        dirs[:] = [name for name in dirs if not any(s.match_file(f"{(relative / name).as_posix()}/") for s in pruning)]
        files += [path for path in ((relative / name).as_posix() for name in names)
                  if not any(spec.match_file(path) for spec in specs)]  # fmt: skip
    return sorted(files)


def is_uploaded(folder: Path, path: str) -> bool:
    """Whether the file at `path` (from the working directory, `folder`) is one of uploaded_files(folder): inside it,
    in no folder the walk skips and not itself left out. Reads no other file."""
    relative = Path(os.path.relpath(os.path.abspath(path), folder.resolve()))  # not resolve(): a link is uploaded
    if relative.parts[:1] == ("..",):
        return False
    specs = ignore_specs(folder)
    pruning = [spec for spec in specs if all(pattern.include is not False for pattern in spec.patterns)]
    parents = [parent.as_posix() for parent in reversed(relative.parents) if parent != Path(".")]
    if any(spec.match_file(f"{parent}/") for parent in parents for spec in pruning):
        return False
    return not any(spec.match_file(relative.as_posix()) for spec in specs)


def name_large_files(folder: Path, names: list[str]) -> None:
    """A line on stderr for each uploaded file of LARGE_FILE_BYTES or more, with the .amlignore line that leaves it
    out: a data file in the code folder is uploaded with every job, where --inputs uploads it once."""
    for name in names:
        size = (folder / name).stat().st_size
        if size >= LARGE_FILE_BYTES and name not in named_large:
            named_large.add(name)
            print(
                f"note: the code upload takes {name} ({size / 2**20:.0f} MB) with every job; add the line /{name} to "
                ".amlignore to leave it out, and give it as data with --inputs+ OPTION=PATH (scripts.pipeline: --data)",
                file=sys.stderr,
            )


@contextlib.contextmanager
def code_snapshot(folder: Path) -> Iterator[Path]:
    """A temporary copy of what Azure ML uploads of `folder` (hard links where the file system allows), removed
    on leaving the block; its large files are named on stderr (name_large_files)."""
    with tempfile.TemporaryDirectory(prefix="code-") as temporary:
        snapshot = Path(temporary) / folder.resolve().name
        names = uploaded_files(folder)
        name_large_files(folder, names)
        for name in names:
            target = snapshot / name
            target.parent.mkdir(parents=True, exist_ok=True)
            source = (folder / name).resolve()  # a link's target: the SDK uploads what a link points to
            try:
                os.link(source, target)
            except OSError:  # another file system
                shutil.copyfile(source, target)
        snapshot.mkdir(exist_ok=True)
        yield snapshot
