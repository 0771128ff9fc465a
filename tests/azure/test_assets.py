"""scripts.assets: the tasks' data and the environments as named, versioned Azure ML assets, checked offline by the
real azure-ai-ml objects: the YAML through load_data / load_environment, the MLTable file as mltable reads it, and
creation through MLClient over the fake HTTP transport of tests/azure/fake_azure.py (no Azure is reachable)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import requests
import yaml

from scripts.assets import data, environment, main
from tests.azure.fake_azure import WORKSPACE, FakeAzureML, fake_client
from tests.conftest import REPO

PENGUINS_CSV = REPO / "configs/examples/penguins.csv"


@pytest.fixture(autouse=True)
def at_repo_root(monkeypatch, tmp_path):
    monkeypatch.chdir(REPO)  # the environments' conda files are this folder's
    monkeypatch.setattr("scripts.azure_ml.assets.MLTABLE_ROOT", tmp_path / "assets")  # not this repo's outputs/


def documents(text: str) -> list[dict]:
    return [yaml.safe_load(part) for part in text.split("---\n")]


def test_a_file_a_folder_and_a_csv_as_an_mltable_read_back_with_load_data(tmp_path, capsys):
    from azure.ai.ml import load_data

    mnist = tmp_path / "mnist"
    mnist.mkdir()
    (mnist / "train-images-idx3-ubyte.gz").write_bytes(b"\x1f\x8b")
    main(["data", "mnist", str(mnist), "--version", "1", "--dry_run", "true", "--yaml_dir", str(tmp_path / "yml")])
    assert capsys.readouterr().out == (
        f"wrote {tmp_path}/yml/data-mnist.yml: az ml data create -f {tmp_path}/yml/data-mnist.yml\n"
    )
    folder = load_data(tmp_path / "yml" / "data-mnist.yml")
    assert (folder.name, folder.version, folder.type) == ("mnist", "1", "uri_folder")
    assert Path(folder.path).resolve() == mnist  # relative to the YAML's folder, for `az ml data create -f`

    text = data("penguins", str(PENGUINS_CSV), "3", mltable=True, dry_run=True)
    printed = capsys.readouterr().out
    assert printed.startswith("# data-penguins.yml: azureml:penguins:3\n")
    assert "# data-penguins-table.yml: azureml:penguins-table:3\n" in printed
    csv, table = documents(text)
    assert (csv["type"], (REPO / csv["path"]).resolve()) == ("uri_file", PENGUINS_CSV)  # for YAML at the root
    assert (table["name"], table["version"], table["type"]) == ("penguins-table", "3", "mltable")
    data("penguins", str(PENGUINS_CSV), "3", mltable=True, dry_run=True, yaml_dir=str(tmp_path / "yml"))
    loaded = load_data(tmp_path / "yml" / "data-penguins-table.yml")
    assert (loaded.name, loaded.version, loaded.type) == ("penguins-table", "3", "mltable")
    assert ((tmp_path / "yml" / loaded.path).resolve() / "MLTable").is_file()
    assert load_data(tmp_path / "yml" / "data-penguins.yml").type == "uri_file"


def read_as_mltable(folder: Path) -> pd.DataFrame:
    """What mltable.load(folder).to_pandas_dataframe() does with the MLTable file written here: each `file` of its
    paths, relative to the MLTable's folder, read with its read_delimited settings (the first line the header)."""
    table = yaml.safe_load((folder / "MLTable").read_text())
    assert table["type"] == "mltable"
    (step,) = table["transformations"]
    settings = step["read_delimited"]
    assert settings["header"] == "all_files_same_headers" and settings["encoding"] == "utf8"
    frames = [
        pd.read_csv(folder / entry["file"], sep=settings["delimiter"], header=0, encoding="utf-8")
        for entry in table["paths"]
    ]
    return pd.concat(frames, ignore_index=True)


def test_the_mltable_names_the_csv_beside_it_and_reads_the_same_table_as_pandas(tmp_path):
    tsv = tmp_path / "penguins.tsv"
    tsv.write_text(PENGUINS_CSV.read_text().replace(",", "\t"))
    for source, delimiter in ((PENGUINS_CSV, ","), (tsv, "\t")):
        data("penguins", str(source), "1", mltable=True, dry_run=True)
        folder = tmp_path / "assets" / "penguins-table"
        assert sorted(path.name for path in folder.iterdir()) == ["MLTable", source.name]  # what Azure ML uploads
        table = yaml.safe_load((folder / "MLTable").read_text())
        assert table["paths"] == [{"file": f"./{source.name}"}]
        assert table["transformations"][0]["read_delimited"]["delimiter"] == delimiter
        assert table["$schema"].endswith("/MLTable.schema.json")
        expected = pd.read_csv(PENGUINS_CSV)
        pd.testing.assert_frame_equal(read_as_mltable(folder), expected)
        assert list(expected.columns) == ["Island", "CulmenLength", "CulmenDepth", "FlipperLength", "BodyMass"]


def test_registering_again_the_csv_an_earlier_mltable_holds_keeps_it(tmp_path):
    data("penguins", str(PENGUINS_CSV), "1", mltable=True, dry_run=True)
    folder = tmp_path / "assets" / "penguins-table"
    data("penguins", str(folder / PENGUINS_CSV.name), "2", mltable=True, dry_run=True)  # the copy the first one made
    assert sorted(path.name for path in folder.parent.iterdir()) == ["penguins-table"]
    assert sorted(path.name for path in folder.iterdir()) == ["MLTable", PENGUINS_CSV.name]
    pd.testing.assert_frame_equal(read_as_mltable(folder), pd.read_csv(PENGUINS_CSV))


@pytest.mark.parametrize(
    ("kind", "name", "conda", "image"),
    [
        ("training", "lightning-training", "environment.yml", "openmpi4.1.0-ubuntu22.04:latest"),
        (
            "training-gpu",
            "lightning-training-gpu",
            "environment.yml",
            "openmpi4.1.0-cuda11.8-cudnn8-ubuntu22.04:latest",
        ),
        ("serving", "lightning-serving", "scripts/serving/environment.yml", "openmpi4.1.0-ubuntu22.04:latest"),
    ],
)
def test_the_environments_read_back_with_load_environment(kind, name, conda, image, tmp_path, capsys):
    from azure.ai.ml import load_environment

    environment(kind, "2", dry_run=True, yaml_dir=str(tmp_path))
    loaded = load_environment(tmp_path / f"environment-{name}.yml")
    assert (loaded.name, loaded.version) == (name, "2")
    assert loaded.image.endswith(f"/{image}")
    assert loaded.conda_file == yaml.safe_load((REPO / conda).read_text())  # the file jobs and deployments build


def test_creation_uploads_the_data_and_puts_each_version_over_the_fake_transport(tmp_path, monkeypatch, capsys):
    azure = FakeAzureML()
    # The SDK's blob clients open sessions of their own: every session answers from the fake.
    monkeypatch.setattr(
        requests.Session, "request", lambda session, method, url, *a, **k: azure.request(method, url, *a, **k)
    )
    client = fake_client(azure)
    monkeypatch.setattr("scripts.assets.workspace_client", lambda *ids: client)
    assert data("penguins", str(PENGUINS_CSV), "3", mltable=True) == "azureml:penguins:3 azureml:penguins-table:3"
    assert environment("training", "1") == "azureml:lightning-training:1"
    out = capsys.readouterr().out.splitlines()
    assert [line for line in out if line.startswith("created")] == [
        "created data azureml:penguins:3", "created data azureml:penguins-table:3",
        "created environment azureml:lightning-training:1",
    ]  # fmt: skip
    uploaded = {blob.split("/", 2)[2]: content for blob, content in azure.blobs.items()}  # LocalUpload/<hash>/...
    assert uploaded["penguins.csv"] == PENGUINS_CSV.read_bytes()
    assert uploaded["penguins-table/penguins.csv"] == PENGUINS_CSV.read_bytes()
    assert b"read_delimited" in uploaded["penguins-table/MLTable"]
    puts = {
        path.removeprefix(WORKSPACE): body["properties"] for method, path, body in azure.requests if method == "PUT"
    }
    csv, table = puts["/data/penguins/versions/3"], puts["/data/penguins-table/versions/3"]
    assert csv["dataType"] == "uri_file" and csv["dataUri"].endswith("/penguins.csv")
    assert table["dataType"] == "mltable" and table["dataUri"].endswith("/penguins-table")
    assert re.fullmatch(r"azureml://datastores/workspaceblobstore/paths/LocalUpload/\w+/penguins.csv", csv["dataUri"])
    env = puts["/environments/lightning-training/versions/1"]
    assert env["image"].endswith("openmpi4.1.0-ubuntu22.04:latest")
    assert yaml.safe_load(env["condaFile"]) == yaml.safe_load((REPO / "environment.yml").read_text())


def test_data_the_workspaces_storage_cannot_take_is_one_line_before_any_upload(monkeypatch, capsys):
    """Its storage out of this machine's reach (a name that does not resolve), the upload retried for ~100 s and
    ended in the SDK's traceback."""
    from tests.azure.fake_azure import UnreachableStorage

    azure = UnreachableStorage("dns")
    monkeypatch.setattr(
        requests.Session, "request", lambda session, method, url, *a, **k: azure.request(method, url, *a, **k)
    )
    client = fake_client(azure)
    monkeypatch.setattr("scripts.assets.workspace_client", lambda *ids: client)
    with pytest.raises(SystemExit) as exit:
        main(["data", "penguins", str(PENGUINS_CSV), "--version", "3"])
    assert exit.value.code == (
        "error: this machine cannot reach the workspace's storage, https://account.blob.core.windows.net (Failed to "
        "resolve 'account.blob.core.windows.net' ([Errno -2] Name or service not known)), where "
        f"{PENGUINS_CSV.resolve()} would be uploaded; check this machine's network: DNS, a firewall, or a private "
        "endpoint it is outside of; or run this command on a machine that reaches it (an Azure ML compute instance)"
    )
    assert azure.storage_requests == 1 and not [path for method, path, _ in azure.requests if method == "PUT"]
    assert "created" not in capsys.readouterr().out


def test_yaml_dir_never_writes_over_a_file_of_the_users(tmp_path):
    args = ["data", "penguins", str(PENGUINS_CSV), "--dry_run", "true", "--yaml_dir", str(tmp_path), "--version"]
    (tmp_path / "data-penguins.yml").write_text("penguins: my own notes\n")
    with pytest.raises(SystemExit) as exit:
        main([*args, "1"])
    assert str(exit.value) == (
        f"error: --yaml_dir {tmp_path}: {tmp_path / 'data-penguins.yml'} is there and is not an Azure ML data asset's "
        "YAML, and it would be written over; give another folder"
    )
    assert (tmp_path / "data-penguins.yml").read_text() == "penguins: my own notes\n"
    (tmp_path / "data-penguins.yml").unlink()
    main([*args, "1"])
    main([*args, "2"])  # the asset's own YAML, written before, is replaced
    assert yaml.safe_load((tmp_path / "data-penguins.yml").read_text())["version"] == "2"


def test_a_folder_without_a_file_is_one_line_not_the_sdks_traceback(tmp_path, monkeypatch):
    """The SDK refuses an empty folder only once it uploads, with its EmptyDirectoryError's traceback; the dry run's
    YAML would be refused by `az ml data create -f` alike."""
    azure = FakeAzureML()
    monkeypatch.setattr(
        requests.Session, "request", lambda session, method, url, *a, **k: azure.request(method, url, *a, **k)
    )
    client = fake_client(azure)
    monkeypatch.setattr("scripts.assets.workspace_client", lambda *ids: client)
    (tmp_path / "mnist" / "raw").mkdir(parents=True)  # e.g. a download that never came
    for dry_run in ("false", "true"):
        with pytest.raises(SystemExit) as exit:
            main(["data", "mnist", str(tmp_path / "mnist"), "--version", "1", "--dry_run", dry_run])
        assert exit.value.code == (
            f"error: {tmp_path / 'mnist'}: no file in this folder, and Azure ML registers none; give the folder the "
            "data is in"
        )
    assert not [method for method, *_ in azure.requests if method == "PUT"]


def test_a_file_whose_name_a_jobs_shell_would_split_is_one_line_not_an_asset_no_job_can_read(tmp_path, capsys):
    """Registered, a file keeps its name, which ends the path Azure ML writes into the command of a job that takes it
    (--inputs+ data.init_args.csv_path=azureml:penguins:3,type=uri_file), unquoted: as for a job's own upload."""
    data = tmp_path / "penguins 2024.csv"
    data.write_text(PENGUINS_CSV.read_text())
    with pytest.raises(SystemExit) as exit:
        main(["data", "penguins", str(data), "--version", "1", "--dry_run", "true"])
    assert exit.value.code == (
        f"error: {data}: Azure ML writes the uploaded file's path, 'penguins 2024.csv' at its end, into the job's "
        "command as it is, where a shell would split it; give a copy whose name has no spaces, quotes or shell "
        "characters"
    )
    assert capsys.readouterr().out == ""


@pytest.mark.parametrize(
    ("args", "line"),
    [
        (["data", "pen guins", "data/penguins.csv", "--version", "1"], "name 'pen guins': Azure ML refuses it; give"),
        (["data", "azureml:penguins", "x.csv", "--version", "1"], "name 'azureml:penguins': Azure ML refuses it"),
        (["data", "penguins", "configs/examples/penguins.csv", "--version", "v3"], "--version 'v3': give a number"),
        (["data", "penguins", "configs/examples/penguins.csv"],  # was "--version '': give a number"
         "--version is missing: give the version to create, a number, e.g. --version 3 (versions are immutable: "
         "changed data is the next one)"),
        (["environment", "serving"], "--version is missing: give the version to create, a number, e.g. --version 3"),
        (["data", "penguins", "configs/examples/penguins.csv", "--version", "03"],
         "--version '03': give it as 3 (Azure ML would keep '03' and '3' as two versions)"),
        (["environment", "serving", "--version", "00"], "--version '00': give it as 0 (Azure ML would keep '00' and"),
        (["data", "penguins", "no/such.csv", "--version", "1", "--mltable", "true"],
         "no/such.csv: no such file or folder; give the data's file or folder"),
        (["data", "birds", "configs", "--version", "1", "--mltable", "true"],
         "--mltable true: configs is not a .csv or .tsv file; an MLTable here reads one such file"),
        (["environment", "train", "--version", "1"], "--kind: 'train' is not a valid value; give training, "),
        (["environment", "training", "--version", "1", "--name", "my/env"], "--name 'my/env': Azure ML refuses it"),
        (["environment", "serving", "--version", "1", "--yaml_dir", "d"], "--yaml_dir writes the YAML instead of"),
        (["environment", "serving", "--version", "1", "--workspace", "ws"], "name the workspace with all three of"),
        (["data", "penguins", "configs/examples/penguins.csv", "--version", "1", "--dry_run", "true", "--yaml_dir",
          "README.md"], "--yaml_dir README.md: README.md is a file, not a folder; give a folder, e.g. assets/"),
    ],
)  # fmt: skip
def test_a_mistake_is_one_line_before_the_azure_sdk_is_imported(args, line):
    command = [sys.executable, "-X", "importtime", "-m", "scripts.assets", *args]
    result = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=60)
    assert result.returncode == 1
    messages = [text for text in result.stderr.splitlines() if not text.startswith("import time:")]
    assert len(messages) == 1 and messages[0].startswith(f"error: {line}"), messages
    imported = [text.rsplit("|", 1)[-1].strip() for text in result.stderr.splitlines() if text.startswith("import")]
    assert not [name for name in imported if name.startswith("azure")]


def test_the_mltable_written_is_the_one_the_table_task_is_tested_with():
    """tests/test_table.py reads an MLTable folder written as this module writes one (the core has no azure code)."""
    import yaml

    from scripts.azure_ml.assets import mltable_text
    from tests.test_table import MLTABLE

    assert yaml.safe_load(mltable_text("t.csv", ",")) == yaml.safe_load(MLTABLE)
