"""The code snapshot submit hands to the SDK holds exactly what the SDK would upload of the folder: the same files,
so the same content hash (computed here by the SDK itself, whose private hashing is the reference).

    .venv/bin/python -m pytest tests/azure/test_code_snapshot.py
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from azure.ai.ml._utils._asset_utils import get_content_hash, get_ignore_file, get_upload_files_from_folder

from scripts.azure_ml.code_snapshot import LEFT_OUT, code_snapshot, uploaded_files
from scripts.submit import submit
from tests.azure.fake_azure import FakeAzureML, fake_client
from tests.conftest import REPO


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


SECRETS_AND_CHECKPOINTS = {
    ".env": "AZURE_CLIENT_SECRET=s3cret\n",
    "configs/.env.local": "DATABRICKS_TOKEN=dapi-token\n",
    "certs/client.pem": "-----BEGIN PRIVATE KEY-----\n",
    ".ssh/id_rsa": "-----BEGIN OPENSSH PRIVATE KEY-----\n",
    "best.ckpt": "weights",
    "scripts/old/last.ckpt": "weights",
    "credentials.json": '{"client_secret": "s3cret"}',
    "configs/gcp-credentials.json": '{"private_key": "s3cret"}',
    "model.onnx": "weights",
    "outputs-old/network.pt": "weights",
    "weights/resnet.pth": "weights",
    "model.safetensors": "weights",
    "kaggle.json": '{"username": "me", "key": "s3cret"}',
    ".kaggle/kaggle.json": '{"username": "me", "key": "s3cret"}',
    ".pypirc": "[pypi]\npassword = pypi-s3cret\n",
    ".npmrc": "//registry.npmjs.org/:_authToken=s3cret\n",
    "configs/secrets.yaml": "storage_key: s3cret\n",
    "secrets.yml": "storage_key: s3cret\n",
    "outputs-old/mlflow.db": "SQLite format 3",
    "scaler.pkl": "weights",
    "model.pickle": "weights",
    "model.pt2": "weights",
}


@pytest.mark.parametrize("ignore_file", [".amlignore", ".gitignore"])
def test_secrets_and_checkpoints_are_never_uploaded_and_the_sdk_leaves_them_out_too(tmp_path, ignore_file):
    """A .env (an Azure secret in it), keys and stray checkpoints stay out, whichever ignore file the project has and
    whatever it says; with the repository's .amlignore the SDK's own walk (`az ml job create -f`) leaves them out
    too."""
    ignored = (REPO / ignore_file).read_text()
    project = a_project(tmp_path / "project", ignore_file, ignored)
    for name, text in SECRETS_AND_CHECKPOINTS.items():
        (project / name).parent.mkdir(parents=True, exist_ok=True)
        (project / name).write_text(text)
    uploaded = uploaded_files(project)
    assert not set(SECRETS_AND_CHECKPOINTS) & set(uploaded)
    assert "scripts/train.py" in uploaded and "configs/task.yaml" in uploaded
    with code_snapshot(project) as snapshot:
        assert "s3cret" not in "".join(p.read_text() for p in snapshot.rglob("*") if p.is_file())
    if ignore_file == ".amlignore":
        assert uploaded == sdk_files(project)


def test_a_large_file_uploaded_is_named_with_the_amlignore_line_that_leaves_it_out(tmp_path, capsys, monkeypatch):
    """A 300 MB CSV at the root goes up with every job: said once, with the line, and left out once it is added."""
    from scripts.azure_ml import code_snapshot as snapshots
    from scripts.azure_ml.yaml_files import print_or_write_yaml

    project = a_project(tmp_path / "project", ".amlignore", (REPO / ".amlignore").read_text())
    with open(project / "penguins-300MB.csv", "wb") as file:
        file.truncate(300 * 2**20)  # sparse: no disk taken
    (project / "small.csv").write_text("species\n")
    with code_snapshot(project):
        pass
    with code_snapshot(project):  # a local pipeline's next step: said once
        pass
    note = capsys.readouterr().err.splitlines()
    assert note == [
        "note: the code upload takes penguins-300MB.csv (300 MB) with every job; add the line /penguins-300MB.csv to "
        ".amlignore to leave it out, and give it as data with --inputs+ OPTION=PATH (scripts.pipeline: --data)"
    ]
    snapshots.named_large.clear()
    monkeypatch.chdir(project)  # a dry run: `az ml job create -f` of its YAML would upload the file too
    print_or_write_yaml(None, lambda job: "type: command\n", None)
    assert capsys.readouterr().err.splitlines() == note
    snapshots.named_large.clear()
    with open(project / ".amlignore", "a") as file:
        file.write("/penguins-300MB.csv\n")
    assert "penguins-300MB.csv" not in uploaded_files(project) and "small.csv" in uploaded_files(project)


def test_what_gitignore_leaves_out_stays_out_beside_an_amlignore(tmp_path):
    """The SDK reads only .amlignore when there is one: a big file the user keeps out of git would be uploaded."""
    project = a_project(tmp_path / "project", ".amlignore", (REPO / ".amlignore").read_text())
    (project / ".gitignore").write_text((REPO / ".gitignore").read_text() + "/penguins-10GB.csv\n")
    (project / "penguins-10GB.csv").write_text("species\n")
    assert "penguins-10GB.csv" in sdk_files(project)
    assert "penguins-10GB.csv" not in uploaded_files(project)
    assert "README.md" in uploaded_files(project)


def test_the_repositorys_amlignore_holds_gitignore_and_the_secrets():
    """So that `az ml job create -f` of a --dry_run YAML, which uploads through the SDK's walk, leaves out the same."""
    lines = {line.strip() for line in (REPO / ".amlignore").read_text().splitlines()}
    gitignore = [line for line in (REPO / ".gitignore").read_text().splitlines() if line and line[0] != "#"]
    # `.venv` (no slash) covers git's `.venv/` and a link named .venv as well
    assert not {pattern for pattern in [*gitignore, *LEFT_OUT] if not {pattern, pattern.rstrip("/")} & lines}


@pytest.mark.slow
def test_a_submission_asks_for_the_repositorys_own_code_snapshot(monkeypatch, capsys):
    """The workspace is asked for the snapshot by this repository's hash (with its .venv inside, as make creates it):
    the one the SDK's own walk of the folder would give, so a snapshot Azure ML has is found, not uploaded again."""
    azure = FakeAzureML()
    monkeypatch.setattr("scripts.submit.workspace_client", lambda *ids: fake_client(azure))
    monkeypatch.chdir(REPO)
    submit("configs/penguins.yaml", compute="cpu-cluster")
    assert capsys.readouterr().out.startswith("submitted ")
    assert azure.code_hashes == [sdk_hash(REPO)]
