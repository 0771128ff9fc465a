"""The code snapshot submit hands to the SDK holds exactly what the SDK would upload of the folder: the same files,
so the same content hash (computed here by the SDK itself, whose private hashing is the reference).

    .venv/bin/python -m pytest tests/test_code_snapshot.py
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from azure.ai.ml._utils._asset_utils import get_content_hash, get_ignore_file, get_upload_files_from_folder

from scripts.azure_ml.code_snapshot import code_snapshot, uploaded_files
from scripts.submit import submit
from tests.conftest import REPO
from tests.fake_azure import FakeAzureML, fake_client


def sdk_files(folder: Path) -> list[str]:
    """The relative paths the SDK uploads of `folder`."""
    return sorted(remote for _, remote in get_upload_files_from_folder(folder, ignore_file=get_ignore_file(folder)))


def sdk_hash(folder: Path) -> str:
    return get_content_hash(folder, get_ignore_file(folder))


def a_project(folder: Path, ignore_file: str, ignored: str) -> Path:
    """A repository as a user has it: code, an environment inside it (a link to another one too), runs, data."""
    files = {
        "README.md": "# mine\n",
        "scripts/train.py": "print('fit')\n",
        "scripts/__pycache__/train.cpython-311.pyc": "\0",
        "configs/task.yaml": "trainer: {}\n",
        "configs/outputs/kept.yaml": "a folder named like an ignored one, below the root\n",
        ".venv/lib/python3.11/site-packages/torch/__init__.py": "x = 1\n" * 50,
        "outputs/1/run/checkpoints/best.ckpt": "weights",
        "outputs/keep.txt": "taken back by a ! pattern where there is one\n",
        "data/penguins.csv": "species\n",
        "tests/test_it.py": "def test(): pass\n",
        "config.json": '{"subscription_id": "s"}\n',
        ignore_file: ignored,
    }
    for name, text in files.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text(text)
    os.symlink(folder / "README.md", folder / "README-link.md")  # a link to a file: its target's bytes go up
    return folder


@pytest.mark.parametrize(
    "ignore_file, ignored",
    [
        (".amlignore", (REPO / ".amlignore").read_text()),
        (".gitignore", "/outputs/\n!outputs/keep.txt\n__pycache__/\n.venv*\n*.json\n"),  # no .amlignore: git's
    ],
    ids=["amlignore", "gitignore-with-negation"],
)
def test_the_snapshot_holds_the_files_the_sdk_uploads_and_has_their_hash(tmp_path, ignore_file, ignored):
    project = a_project(tmp_path / "project", ignore_file, ignored)
    assert uploaded_files(project) == sdk_files(project)
    assert ".venv/lib/python3.11/site-packages/torch/__init__.py" not in uploaded_files(project)
    with code_snapshot(project) as snapshot:
        assert sorted(str(p.relative_to(snapshot)) for p in snapshot.rglob("*") if p.is_file()) == sdk_files(project)
        assert (snapshot / "README-link.md").read_text() == "# mine\n"
        assert sdk_hash(snapshot) == sdk_hash(project)
    assert not snapshot.exists()
    assert (project / "README.md").read_text() == "# mine\n"  # nothing of the user's moved or changed


def test_a_link_to_an_environment_elsewhere_is_left_out_by_its_name(tmp_path):
    """The SDK matches .amlignore against a linked folder's target path, so it uploads a link `.venv-serve` to an
    environment kept elsewhere; the snapshot goes by the name in the repository, as .amlignore reads."""
    project = a_project(tmp_path / "project", ".amlignore", (REPO / ".amlignore").read_text())
    elsewhere = tmp_path / "environments/serving"
    (elsewhere / "bin").mkdir(parents=True)
    (elsewhere / "bin/python").write_text("elf")
    os.symlink(elsewhere, project / ".venv-serve")
    assert ".venv-serve/bin/python" not in uploaded_files(project)


@pytest.mark.slow
def test_a_submission_asks_for_the_repositorys_own_code_snapshot(monkeypatch, capsys):
    """The workspace is asked for the snapshot by this repository's hash (with its .venv inside, as make creates it):
    the one the SDK's own walk of the folder would give, so a snapshot Azure ML has is found, not uploaded again."""
    azure = FakeAzureML()
    monkeypatch.setattr("scripts.submit.workspace_client", lambda *ids: fake_client(azure))
    monkeypatch.chdir(REPO)
    submit("configs/penguins.yaml", "cpu-cluster")
    assert capsys.readouterr().out.startswith("submitted ")
    assert azure.code_hashes == [sdk_hash(REPO)]
