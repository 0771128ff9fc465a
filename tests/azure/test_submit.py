"""scripts.submit: the Azure ML job for any config, checked offline by the real azure-ai-ml objects: the job's
YAML through `load_job`, and submissions through MLClient over a fake HTTP transport (no Azure is reachable)
answering as Azure ML's REST API and the workspace's blob storage would."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import sys
from pathlib import Path

import pytest
import requests
import yaml

from scripts.azure_ml.errors import SubmitError
from scripts.azure_ml.images import BASE_IMAGE, GPU_IMAGE
from scripts.azure_ml.jobs import MPI_STOP_GRACE, build_job
from scripts.azure_ml.workspace import workspace_client
from scripts.submit import main, submit
from tests.azure.fake_azure import (
    BLOB_STORE,
    STUDIO,
    WORKSPACE,
    FakeAzureML,
    FakeCredential,
    fake_client,
    http_response,
)
from tests.conftest import REPO, run_module

HOROVOD = "configs/trainer/horovod.yaml"


@pytest.fixture(autouse=True)
def at_repo_root(monkeypatch):
    monkeypatch.chdir(REPO)  # job code is this folder; config paths are relative to it


def test_one_process_runs_the_train_command_in_the_tasks_experiment():
    job = build_job(["configs/penguins.yaml"], "cpu-cluster")
    assert job.command == (
        "python -m scripts.train fit --config configs/penguins.yaml --checkpoint_dir ${{outputs.checkpoints}}"
    )
    assert (job.outputs["checkpoints"].type, job.outputs["checkpoints"].mode) == ("uri_folder", "rw_mount")
    assert (job.compute, job.resources.instance_count, job.distribution) == ("cpu-cluster", 1, None)
    assert job.experiment_name == "penguins"  # the config's logger's, so local and Azure runs sit side by side
    assert Path(job.code).resolve() == REPO
    assert job.environment.conda_file == yaml.safe_load((REPO / "environment.yml").read_text())


@pytest.mark.parametrize(
    "train_args",
    [
        "--trainer.logger.init_args.experiment_name penguins-lr",
        "--trainer.max_epochs 5 --trainer.logger.init_args.experiment_name=penguins-lr",
        "--trainer.logger.experiment_name 'penguins-lr'",
    ],
)
def test_an_experiment_named_in_train_args_is_the_jobs(train_args):
    """Azure ML hands every process the job's experiment (MLFLOW_EXPERIMENT_NAME), which scripts.train takes over the
    logger's: the job must be in the experiment the user named, not the config's."""
    job = build_job(["configs/penguins.yaml"], "cpu-cluster", train_args=train_args)
    assert job.experiment_name == "penguins-lr"
    assert build_job(["configs/penguins.yaml"], "c", train_args=train_args, experiment="other").experiment_name == (
        "other"
    )  # --experiment says it outright


@pytest.mark.parametrize(
    ("distribution", "preset", "kind"),
    [("pytorch", "configs/trainer/ddp.yaml", "pytorch"), ("mpi", "configs/trainer/ddp_mpi.yaml", "mpi")],
)
def test_several_processes_run_ddp_with_devices_and_nodes_that_match_the_job(distribution, preset, kind):
    job = build_job(["configs/mnist.yaml", "configs/trainer/gpu.yaml"], "gpu", 2, 4, distribution)
    assert job.command == (
        "python -m scripts.train fit --config configs/mnist.yaml --config configs/trainer/gpu.yaml "
        f"--config {preset} --trainer.devices 4 --trainer.num_nodes 2 --checkpoint_dir ${{{{outputs.checkpoints}}}}"
    )
    assert (job.distribution.type, job.distribution.process_count_per_instance) == (kind, 4)
    assert job.resources.instance_count == 2


@pytest.fixture
def horovod_context(tmp_path, monkeypatch) -> Path:
    monkeypatch.setattr("scripts.azure_ml.images.HOROVOD_CONTEXT", tmp_path / "horovod-image")  # not outputs/
    return tmp_path / "horovod-image"


def test_horovod_runs_under_mpi_on_the_image_its_dockerfile_builds_from_only_the_files_it_copies(horovod_context):
    job = build_job(["configs/penguins.yaml", "configs/trainer/horovod.yaml"], "cpu", 2, 2, "mpi")
    assert job.command == (  # no DDP preset: the config's Horovod strategy joins mpirun's processes
        "python -m scripts.train fit --config configs/penguins.yaml --config configs/trainer/horovod.yaml "
        "--trainer.devices 2 --trainer.num_nodes 2 --checkpoint_dir ${{outputs.checkpoints}}"
    )
    assert (job.distribution.type, job.distribution.process_count_per_instance) == ("mpi", 2)
    build = job.environment.build
    assert (Path(build.path), build.dockerfile_path) == (horovod_context, "Dockerfile")
    sent = sorted(str(path.relative_to(horovod_context)) for path in horovod_context.rglob("*") if path.is_file())
    # What Azure ML hashes, uploads and builds: a code change elsewhere reuses the image.
    assert sent == ["Dockerfile", "environment.yml", "scripts/build_horovod.py"]
    for name, source in [("Dockerfile", "strategies/horovod/Dockerfile"), *((name, name) for name in sent[1:])]:
        assert (horovod_context / name).read_bytes() == (REPO / source).read_bytes(), name
    dockerfile = (REPO / "strategies/horovod/Dockerfile").read_text()
    assert "FROM mcr.microsoft.com/azureml/openmpi4.1.0-ubuntu22.04:latest" in dockerfile  # BASE_IMAGE, with mpirun
    assert "RUN python /build/scripts/build_horovod.py" in dockerfile  # the build `make horovod` (and CI) runs
    for name in ("Dockerfile", "gpu.Dockerfile"):  # a pipeline's sweep trials get it from the image
        (grace,) = MPI_STOP_GRACE.items()
        assert f"\nENV {grace[0]}={grace[1]}\n" in (REPO / "strategies" / "horovod" / name).read_text(), name


def test_horovod_dry_run_yaml_reads_back_with_its_build_context(horovod_context, tmp_path, capsys):
    from azure.ai.ml import load_job

    text = submit("configs/penguins.yaml", compute="cpu", presets=["configs/trainer/horovod.yaml"], nodes=1,
                 processes_per_node=4, distribution="mpi", dry_run=True,
                  yaml_file=str(tmp_path / "job.yml"))  # fmt: skip
    loaded = load_job(tmp_path / "job.yml")
    build = loaded.environment.build  # its path relative to the YAML's folder
    assert ((tmp_path / build.path).resolve(), build.dockerfile_path) == (horovod_context, "Dockerfile")
    assert (loaded.distribution.type, loaded.distribution.process_count_per_instance) == ("mpi", 4)
    assert loaded.environment_variables == {"OMPI_MCA_odls_base_sigkill_timeout": "10"}  # mpirun's SIGTERM grace
    again = submit("configs/penguins.yaml", compute="cpu", presets=["configs/trainer/horovod.yaml"], nodes=1,
                  processes_per_node=4, distribution="mpi", dry_run=True,
                   yaml_file=str(tmp_path / "again.yml"))  # fmt: skip
    assert yaml.safe_load(again)["environment"] == yaml.safe_load(text)["environment"]  # same version: one image


def test_inputs_are_mounted_and_their_mount_point_given_as_the_option(tmp_path):
    (tmp_path / "penguins.csv").write_text("x\n")
    inputs = [f"data.init_args.path={tmp_path / 'penguins.csv'}", "data.init_args.data_dir=azureml:mnist:1"]
    job = build_job(["configs/penguins.yaml"], "cpu", inputs=inputs, train_args="--trainer.max_epochs 5")
    assert job.command.endswith(
        "--data.init_args.path ${{inputs.path}} --data.init_args.data_dir ${{inputs.data_dir}} --trainer.max_epochs 5"
    )
    assert (job.inputs["path"].type, job.inputs["path"].path) == ("uri_file", str(tmp_path / "penguins.csv"))
    assert (job.inputs["data_dir"].type, job.inputs["data_dir"].path) == ("uri_folder", "azureml:mnist:1")


def test_the_jobs_command_is_one_the_cli_accepts_here():
    job = build_job(["configs/penguins.yaml"], "cpu", 2, 4, "mpi", train_args="--trainer.max_epochs 5")
    args = job.command.removeprefix("python -m scripts.train ").split()
    result = run_module("scripts.train", *args, "--print_config")
    assert result.returncode == 0, result.stderr[-2000:]
    printed = yaml.safe_load(result.stdout)["trainer"]
    assert (str(printed["devices"]), printed["num_nodes"], printed["max_epochs"]) == ("4", 2, 5)
    assert printed["plugins"][0]["class_path"] == "strategies.mpi_environment.MPIEnvironment"


def test_a_config_path_with_a_space_or_a_dollar_is_one_argument_of_the_jobs_command(tmp_path, monkeypatch):
    """The job's command runs in a shell: a user's config named `my task.yaml` must reach scripts.train whole."""
    from scripts.azure_ml.components import plan_components  # extra: serving

    shutil.copy(REPO / "environment.yml", tmp_path)
    (tmp_path / "my configs").mkdir()
    for name in ("my task.yaml", "$HOME.yaml"):
        shutil.copy(REPO / "configs/penguins.yaml", tmp_path / "my configs" / name)
    monkeypatch.chdir(tmp_path)
    configs = ["my configs/my task.yaml", "my configs/$HOME.yaml"]
    job = build_job(configs, "cpu", 2, 2, "mpi")
    assert shlex.split(job.command)[4:8] == ["--config", configs[0], "--config", configs[1]]
    # extra: serving
    monkeypatch.syspath_prepend(str(REPO))
    plan = plan_components(configs)
    for step in ("train", "evaluate"):
        assert shlex.split(plan.commands[step])[4:8] == ["--config", configs[0], "--config", configs[1]], step
    # end extra: serving


@pytest.mark.parametrize(
    "args", [["outputs/penguins/run/config.yaml"], ["../mine.yaml"], ["configs/p.yaml", "--presets+", "../mine.yaml"]]
)
def test_a_config_the_jobs_code_leaves_out_is_one_line(args, tmp_path, monkeypatch, capsys):
    """A run's resolved config (outputs/TASK/RUN/config.yaml) or one outside this folder is a file here but not in the
    job's code: its processes would stop at `--config`, no such file, once Azure ML had built the image."""
    folder = tmp_path / "repo"
    (folder / "outputs/penguins/run").mkdir(parents=True)
    (folder / "configs").mkdir()
    for name in ("environment.yml", ".amlignore", ".gitignore"):
        shutil.copy(REPO / name, folder)
    for config in ("repo/outputs/penguins/run/config.yaml", "mine.yaml", "repo/configs/p.yaml"):
        shutil.copy(REPO / "configs/penguins.yaml", tmp_path / config)
    monkeypatch.chdir(folder)
    with pytest.raises(SystemExit) as exit:
        main([*args, "--compute", "cpu-cluster", "--dry_run", "true"])
    assert str(exit.value.code).startswith(f"error: {args[-1]}: the job's code (this folder, less .amlignore's")
    assert str(exit.value.code).endswith("copy it under configs/, e.g. configs/my_task.yaml")
    assert capsys.readouterr().out == ""
    main(["configs/p.yaml", "--compute", "cpu-cluster", "--dry_run", "true"])  # what is uploaded is taken


def test_a_file_in_train_args_the_jobs_code_leaves_out_is_one_line_naming_the_input(tmp_path, monkeypatch, capsys):
    """The README's new run from a checkpoint, `--ckpt_path outputs/<exp>/<run>/checkpoints/last.ckpt`, given in
    --train_args: no checkpoint goes with the job's code, so the job would fail at its start; as an input it goes."""
    folder = tmp_path / "repo"
    (folder / "outputs/penguins/run/checkpoints").mkdir(parents=True)
    (folder / "configs").mkdir()
    for name in ("environment.yml", ".amlignore", ".gitignore"):
        shutil.copy(REPO / name, folder)
    shutil.copy(REPO / "configs/penguins.yaml", folder / "configs")
    checkpoint = "outputs/penguins/run/checkpoints/last.ckpt"
    (folder / checkpoint).write_bytes(b"a checkpoint")
    monkeypatch.chdir(folder)
    for train_args in (f"--ckpt_path {checkpoint}", f"--trainer.max_epochs 5 --ckpt_path={checkpoint}"):
        with pytest.raises(SystemExit) as exit:
            main(["configs/penguins.yaml", "--compute", "c", "--dry_run", "true", f"--train_args={train_args}"])
        assert str(exit.value.code).startswith(f"error: --train_args --ckpt_path {checkpoint}: a file here that the")
        assert str(exit.value.code).endswith(f"; give it as an input: --inputs+ ckpt_path={checkpoint}")
    assert capsys.readouterr().out == ""
    text = submit("configs/penguins.yaml", compute="c", inputs=[f"ckpt_path={checkpoint}"], dry_run=True)
    assert yaml.safe_load(text)["command"].endswith("--ckpt_path ${{inputs.ckpt_path}}")


@pytest.mark.slow
@pytest.mark.parametrize(
    ("task", "option", "path", "kind"),
    [("penguins", "data.init_args.csv_path", "data/penguins.csv", "file"),
     ("birds", "data.init_args.data_dir", "data/birds", "folder")],
)  # fmt: skip
def test_a_data_path_of_the_config_or_train_args_the_jobs_code_leaves_out_is_one_line_naming_the_input(
    tmp_path, monkeypatch, capsys, task, option, path, kind
):
    """A data file or folder named in a preset's YAML, or in --train_args, under .amlignore's data/ (or outside the
    folder): the job would fail after its image is built; the job, its sweep and the pipeline name --inputs (--data)."""
    from scripts.azure_ml.pipelines import plan_pipeline  # extra: serving

    folder = tmp_path / "repo"
    (folder / "configs").mkdir(parents=True)
    for name in ("environment.yml", ".amlignore", ".gitignore"):
        shutil.copy(REPO / name, folder)
    shutil.copy(REPO / f"configs/{task}.yaml", folder / "configs")
    data = folder / path
    if kind == "file":
        data.parent.mkdir(parents=True)
        data.write_text("species\n")
    else:
        (data / "train/turkey").mkdir(parents=True)
    outside = tmp_path / f"elsewhere-{Path(path).name}"
    shutil.copytree(data, outside) if kind == "folder" else shutil.copy(data, outside)
    name = option.rsplit(".", 1)[-1]
    (folder / "configs/my_data.yaml").write_text(f"data:\n  init_args:\n    {name}: {path}\n")
    monkeypatch.chdir(folder)
    givens = [["--presets+", "configs/my_data.yaml"], [f"--train_args=--{option} {outside}"]]
    sweep = str(REPO / f"configs/sweeps/{task}.yaml")  # extra: sweeps
    givens.append(["--presets+", "configs/my_data.yaml", "--sweep", sweep])  # extra: sweeps
    for given in givens:
        named = str(outside) if "--train_args" in given[0] else path
        with pytest.raises(SystemExit) as exit:
            main([f"configs/{task}.yaml", "--compute", "c", "--dry_run", "true", *given])
        line = str(exit.value.code)  # a file in --train_args: named before the training CLI reads the configs
        assert f"{option} {named}: a {kind} here that the job's code leaves out" in line, line
        assert line.endswith(f"so its processes would not find it; give it as an input: --inputs+ {option}={named}")
    # extra: serving
    with pytest.raises(SubmitError, match=f"give it as an input: --data {path}$"):
        plan_pipeline([f"configs/{task}.yaml", "configs/my_data.yaml"], "c", score_data=str(outside))
    # end extra: serving
    assert capsys.readouterr().out == ""
    text = submit(f"configs/{task}.yaml", compute="c", presets=["configs/my_data.yaml"], inputs=[f"{option}={path}"],
                  dry_run=True)  # fmt: skip
    assert yaml.safe_load(text)["command"].endswith(f"--{option} ${{{{inputs.{name}}}}}")


TABLE_NEEDS = (
    "and the job's fit would stop at its start: the table task needs data.init_args.csv_path"  # its datamodule's line
)
NO_TABLE = "error: configs/table.yaml leaves data.init_args.csv_path and data.init_args.label unset, " + TABLE_NEEDS


@pytest.mark.parametrize(
    ("given", "line"),
    [
        ([], NO_TABLE),
        (["--inputs+", "data.init_args.csv_path=azureml:churn:2,type=uri_file"],
         "error: configs/table.yaml leaves data.init_args.label unset, " + TABLE_NEEDS),
        (["--sweep", "configs/sweeps/table.yaml"], NO_TABLE),  # extra: sweeps
    ],
)  # fmt: skip
def test_a_table_job_without_its_data_or_label_is_one_line_naming_the_options(given, line, capsys):
    """A dry run of configs/table.yaml with no table, or no label column, printed a job's YAML and ended 0: the job
    would have failed on Azure, after its image build, at the datamodule's own check of its arguments."""
    with pytest.raises(SystemExit) as exit:
        main(["configs/table.yaml", "--compute", "c", "--dry_run", "true", *given])
    fixes = '--train_args "--data.init_args.label VALUE"'
    if "csv_path and" in line:
        fixes = f"--inputs+ data.init_args.csv_path=PATH and {fixes}"
    assert str(exit.value.code).startswith(line) and str(exit.value.code).endswith(f"; give {fixes}"), exit.value.code
    assert "\n" not in str(exit.value.code) and capsys.readouterr().out == ""


def test_dry_run_prints_yaml_that_load_job_reads_back(tmp_path, capsys):
    from azure.ai.ml import load_job

    data = tmp_path / "mnist"
    data.mkdir()
    text = submit(
        "configs/mnist.yaml", compute="gpu", nodes=2, inputs=[f"data.init_args.data_dir={data}"], dry_run=True
    )
    assert capsys.readouterr().out == text
    (tmp_path / "job.yml").write_text(text)
    loaded = load_job(tmp_path / "job.yml")
    job = build_job(["configs/mnist.yaml"], "gpu", nodes=2, inputs=[f"data.init_args.data_dir={data}"])
    assert loaded.command == job.command
    assert (loaded.compute, loaded.resources.instance_count, loaded.distribution.type) == ("gpu", 2, "pytorch")
    assert (REPO / loaded.inputs["data_dir"].path).resolve() == data  # uploaded with the job; relative to job.yml
    assert loaded.environment.image == job.environment.image


def test_submit_puts_the_job_with_its_code_environment_and_compute(monkeypatch, capsys):
    from azure.ai.ml import MLClient
    from azure.core.pipeline.transport import RequestsTransport

    azure = FakeAzureML()
    client = MLClient(FakeCredential(), "00000000-0000-0000-0000-000000000000", "rg", "ws",
                      transport=RequestsTransport(session=azure))  # fmt: skip
    monkeypatch.setattr("scripts.submit.workspace_client", lambda *ids: client)
    name = submit("configs/penguins.yaml", compute="cpu-cluster", nodes=2, processes_per_node=2, distribution="mpi")
    assert capsys.readouterr().out == f"submitted {name}: {STUDIO}\n"
    (environment,) = [sent for method, path, sent in azure.requests if method == "PUT" and "/environments/" in path]
    conda = yaml.safe_load(environment["properties"]["condaFile"])
    assert conda == yaml.safe_load((REPO / "environment.yml").read_text())
    (job,) = [sent for method, path, sent in azure.requests if method == "PUT" and path.endswith(f"/jobs/{name}")]
    job = job["properties"]
    assert job["command"] == build_job(["configs/penguins.yaml"], "c", 2, 2, "mpi").command
    assert job["computeId"] == f"{WORKSPACE}/computes/cpu-cluster"
    assert job["codeId"].startswith(f"{WORKSPACE}/codes/") and job["environmentId"].startswith(f"{WORKSPACE}/env")
    assert (job["experimentName"], job["resources"]["instanceCount"]) == ("penguins", 2)
    assert job["distribution"] == {"distributionType": "Mpi", "processCountPerInstance": 2}


def test_a_horovod_submission_uploads_only_its_build_context_and_puts_the_environment_built_from_it(
    horovod_context, monkeypatch, capsys
):
    from azure.ai.ml import MLClient

    azure = FakeAzureML()
    # The SDK's blob clients open sessions of their own: every session answers from the fake.
    monkeypatch.setattr(
        requests.Session, "request", lambda session, method, url, *a, **k: azure.request(method, url, *a, **k)
    )
    client = MLClient(FakeCredential(), "00000000-0000-0000-0000-000000000000", "rg", "ws")
    monkeypatch.setattr("scripts.submit.workspace_client", lambda *ids: client)
    name = submit(
        "configs/penguins.yaml",
        compute="cpu-cluster",
        presets=[HOROVOD],
        nodes=2,
        processes_per_node=2,
        distribution="mpi",
    )
    assert capsys.readouterr().out.endswith(f"submitted {name}: {STUDIO}\n")
    uploaded = {blob.split(f"/{horovod_context.name}/", 1)[1]: content for blob, content in azure.blobs.items()}
    assert uploaded == {
        "Dockerfile": (REPO / "strategies/horovod/Dockerfile").read_bytes(),
        "environment.yml": (REPO / "environment.yml").read_bytes(),
        "scripts/build_horovod.py": (REPO / "scripts/build_horovod.py").read_bytes(),
    }
    (environment,) = [sent for method, path, sent in azure.requests if method == "PUT" and "/environments/" in path]
    build = environment["properties"]["build"]
    assert build["dockerfilePath"] == "Dockerfile"
    assert build["contextUri"].startswith(f"{BLOB_STORE}/") and build["contextUri"].endswith(
        f"/{horovod_context.name}/"
    )
    (job,) = [sent for method, path, sent in azure.requests if method == "PUT" and path.endswith(f"/jobs/{name}")]
    assert job["properties"]["distribution"] == {"distributionType": "Mpi", "processCountPerInstance": 2}
    assert "--config configs/trainer/horovod.yaml" in job["properties"]["command"]


def test_the_workspace_comes_from_config_json_or_all_three_ids(tmp_path, monkeypatch):
    ids = {"subscription_id": "00000000-0000-0000-0000-000000000001", "resource_group": "rg", "workspace_name": "ws1"}
    (tmp_path / "config.json").write_text(json.dumps(ids))
    monkeypatch.chdir(tmp_path)
    client = workspace_client(None, None, None)
    assert (client.subscription_id, client.resource_group_name, client.workspace_name) == tuple(ids.values())
    client = workspace_client("00000000-0000-0000-0000-000000000002", "rg2", "ws2")
    assert (client.subscription_id, client.workspace_name) == ("00000000-0000-0000-0000-000000000002", "ws2")
    with pytest.raises(SubmitError, match="all three of --subscription_id --resource_group --workspace"):
        workspace_client(None, "rg", None)
    (tmp_path / "config.json").unlink()
    with pytest.raises(SubmitError, match="no Azure ML workspace: put its config.json"):
        workspace_client(None, None, None)


GUID = "00000000-0000-0000-0000-000000000001"
CONFIG = {"subscription_id": GUID, "resource_group": "rg", "workspace_name": "ws1"}  # the studio's config.json


@pytest.mark.parametrize(
    ("ids", "config", "line"),
    [
        (("abc", "rg", "ws1"), None,
         "--subscription_id 'abc': Azure takes a GUID, 8-4-4-4-12 hexadecimal digits; give the workspace's, as its "
         "config.json (the studio's 'Download config file') has it"),
        ((GUID, "my rg", "ws1"), None, "--resource_group 'my rg': Azure takes 1-90 letters, digits, '_', '-', '.',"),
        ((GUID, "rg.", "ws1"), None, "--resource_group 'rg.': Azure takes 1-90 letters, digits, '_', '-', '.', '(' and "
         "')', not ending in '.'"),
        ((GUID, "rg", "ws"), None, "--workspace 'ws': Azure takes 3-33 letters, digits, '_' and '-', starting with"),
        ((None, None, None), json.dumps(CONFIG).replace("}", ",}"),
         "{config}: not JSON (Expecting property name enclosed in double quotes at line 1); download the workspace's "
         "config.json again (the studio's 'Download config file'), or give --subscription_id --resource_group "
         "--workspace"),
        ((None, None, None), json.dumps({**CONFIG, "workspace_name": None}),
         "{config}: no workspace_name in it; download the workspace's config.json again"),
        ((None, None, None), json.dumps({**CONFIG, "subscription_id": GUID[:-1]}),
         f"{{config}}: subscription_id '{GUID[:-1]}': Azure takes a GUID, 8-4-4-4-12 hexadecimal digits; download"),
        ((None, None, None), json.dumps({**CONFIG, "workspace_name": 7}),
         "{config}: workspace_name 7: Azure takes 3-33 letters"),
    ],
)  # fmt: skip
def test_workspace_ids_azure_refuses_are_one_line_before_any_request(ids, config, line, tmp_path, monkeypatch):
    """A mistyped id (an option, or in config.json, found here or above, .azureml/ first, as MLClient.from_config
    finds it) would reach Azure as an error of the request, after the code's upload; a config.json that is not JSON,
    or lacks an id, was 'no workspace: put its config.json in this folder'."""
    folder = tmp_path / "project" / "src"
    folder.mkdir(parents=True)
    monkeypatch.chdir(folder)
    path = tmp_path / "project" / ".azureml" / "config.json"
    if config is not None:
        path.parent.mkdir()
        path.write_text(config)
    asked = []
    monkeypatch.setattr(requests.Session, "request", lambda *args, **kwargs: asked.append(args))
    with pytest.raises(SubmitError) as error:
        workspace_client(*ids)
    assert str(error.value).startswith(line.format(config=path)) and not asked


def test_a_broken_config_json_is_named_before_anything_is_built(tmp_path, monkeypatch):
    """The workspace's config file was read when the client was made, after the job's ~4 s build (and a pipeline's,
    the assets'): now first, wherever a command will contact the workspace without the three ids."""
    from scripts import assets, deploy, pipeline

    broken = tmp_path / "config.json"
    broken.write_text(json.dumps({**CONFIG, "subscription_id": "s"}))
    monkeypatch.setattr("scripts.azure_ml.workspace.config_file", lambda start: broken)

    class Built(Exception):
        pass

    def build(*args, **kwargs):
        raise Built

    for where in (
        "scripts.submit.build_job",
        "scripts.azure_ml.pipelines.plan_pipeline",
        "scripts.azure_ml.assets.build",
    ):
        monkeypatch.setattr(where, build)
    line = f"{broken}: subscription_id 's': Azure takes a GUID, 8-4-4-4-12 hexadecimal digits; download the"
    commands = [
        lambda: submit("configs/penguins.yaml", compute="cpu-cluster"),
        lambda: pipeline.pipeline(
            "configs/penguins.yaml", compute="cpu-cluster", score_data="configs/examples/penguins.csv"
        ),
        lambda: assets.main(["environment", "training", "--version", "1"]),
        lambda: deploy.main(["online", "penguins-classifier:1", "--endpoint", "penguins"]),
        lambda: deploy.main(
            [
                "batch",
                "penguins-classifier:1",
                "--endpoint",
                "penguins",
                "--compute",
                "cpu-cluster",
                "--inputs",
                "tabular",
            ]
        ),
    ]
    for command in commands:
        with pytest.raises((SubmitError, SystemExit)) as error:
            command()
        message = str(error.value.code if isinstance(error.value, SystemExit) else error.value)
        assert message.removeprefix("error: ").startswith(line), message
    with pytest.raises(Built):  # a dry run asks no workspace: the file is not read
        submit("configs/penguins.yaml", compute="cpu-cluster", dry_run=True)


@pytest.mark.parametrize("given", [["--train_args", "--trainer.max_epochs=5"], ["--train_args=--trainer.max_epochs=5"]])
def test_train_args_whose_first_option_has_an_equals_sign_is_taken_either_way(given, capsys):
    """`--train_args "--trainer.max_epochs=5"`: a value that starts with a dash and has no space, which argparse
    would take for an option of this command ("expected one argument")."""
    main(["configs/penguins.yaml", "--compute", "c", *given, "--dry_run", "true"])
    assert "--trainer.max_epochs=5" in yaml.safe_load(capsys.readouterr().out)["command"]


@pytest.mark.parametrize(("final", "code"), [("Completed", 0), ("Failed", 1)])
def test_stream_follows_the_jobs_logs_and_exits_with_its_status(final, code, monkeypatch, capsys):
    # The SDK's own streaming, over the fake: the job, the workspace's discovery, run history, the log blob.
    azure = FakeAzureML()
    azure.final_status = final
    answer = lambda _, method, url, *a, **k: azure.request(method, url, *a, **k)  # noqa: E731
    monkeypatch.setattr(requests.Session, "request", answer)
    monkeypatch.setattr("azure.ai.ml.operations._job_ops_helper._wait_before_polling", lambda seconds: 0)
    client = fake_client(azure)
    monkeypatch.setattr("scripts.submit.workspace_client", lambda *ids: client)
    if code:
        with pytest.raises(SystemExit) as exit:
            main(["configs/penguins.yaml", "--compute", "cpu-cluster", "--stream", "true"])
        assert re.fullmatch(r"error: job \S+ ended Failed; its logs are above and in the studio", exit.value.code)
    else:
        main(["configs/penguins.yaml", "--compute", "cpu-cluster", "--stream", "true"])
    out = capsys.readouterr().out
    assert "test_acc: 0.9804" in out  # the job's log, streamed
    assert (re.search(r"job \S+ completed", out) is not None) == (code == 0)


UNREACHABLE = {
    "dns": "Failed to resolve 'account.blob.core.windows.net' ([Errno -2] Name or service not known)",
    "firewall": "Connection to account.blob.core.windows.net timed out. (connect timeout=10)",
    "network rules": "its network rules refuse this machine: AuthorizationFailure",
}
CHECK_NETWORK = "check this machine's network: DNS, a firewall, or a private endpoint it is outside of"


@pytest.mark.parametrize("failure", list(UNREACHABLE))
def test_a_local_input_the_workspaces_storage_cannot_take_is_one_line_naming_it_before_any_upload(
    failure, monkeypatch, capsys
):
    """The workspace answered and its storage could not be reached (its name not resolved, a firewall, a private
    endpoint): the SDK's upload of a local --inputs+ retried for ~100 s, then 152 lines and three tracebacks. One
    request to the storage tells now, before anything is uploaded or created."""
    from azure.ai.ml import MLClient

    from tests.azure.fake_azure import UnreachableStorage

    azure = UnreachableStorage(failure)
    monkeypatch.setattr(  # the SDK's blob clients open sessions of their own: every session answers from the fake
        requests.Session, "request", lambda session, method, url, *a, **k: azure.request(method, url, *a, **k)
    )
    client = MLClient(FakeCredential(), "00000000-0000-0000-0000-000000000000", "rg", "ws")
    monkeypatch.setattr("scripts.submit.workspace_client", lambda *ids: client)
    data = "configs/examples/penguins.csv"
    with pytest.raises(SystemExit) as exit:
        main(["configs/table.yaml", "--compute", "cpu-cluster", "--inputs+", f"data.init_args.csv_path={data}",
              "--train_args", "--data.init_args.label Species"])  # fmt: skip
    assert exit.value.code == (
        f"error: this machine cannot reach the workspace's storage, {BLOB_STORE.rsplit('/', 1)[0]} "
        f"({UNREACHABLE[failure]}), where --inputs+ data.init_args.csv_path={data} would be uploaded; "
        f"{CHECK_NETWORK}; or give data already in Azure: a registered data asset azureml:NAME:VERSION (python -m "
        "scripts.assets data NAME PATH --version N, where the storage can be reached) or a datastore URI"
    )
    assert azure.storage_requests == 1 and not [path for method, path, _ in azure.requests if method == "PUT"]
    assert capsys.readouterr().out == ""


@pytest.mark.parametrize("failure", ["dns", "network rules"])
def test_a_code_upload_the_workspaces_storage_cannot_take_is_one_line_not_azure_mls_refusal(
    failure, monkeypatch, capsys
):
    """The code snapshot the workspace lacks goes to its storage in the SDK's own upload: where that fails, the line
    says so, not a traceback nor 'Azure ML refused the job'. (The SDK's storage client retries each request for
    ~100 s first, with no public way to change it: its waits are skipped here.)"""
    from azure.ai.ml import MLClient

    from tests.azure.fake_azure import UnreachableStorage

    azure = UnreachableStorage(failure, has_code=False)
    monkeypatch.setattr(
        requests.Session, "request", lambda session, method, url, *a, **k: azure.request(method, url, *a, **k)
    )
    monkeypatch.setattr("time.sleep", lambda seconds: None)
    client = MLClient(FakeCredential(), "00000000-0000-0000-0000-000000000000", "rg", "ws")
    monkeypatch.setattr("scripts.submit.workspace_client", lambda *ids: client)
    with pytest.raises(SystemExit) as exit:
        main(["configs/penguins.yaml", "--compute", "cpu-cluster"])
    reason = {
        "dns": f"this machine cannot reach https://account.blob.core.windows.net ({UNREACHABLE['dns']})",
        "network rules": "account.blob.core.windows.net's network rules refuse this machine (AuthorizationFailure)",
    }[failure]
    assert exit.value.code == f"error: the upload to the workspace's storage failed: {reason}; {CHECK_NETWORK}"
    assert not [path for method, path, _ in azure.requests if method == "PUT" and "/jobs/" in path]
    assert capsys.readouterr().out == ""


def test_an_azure_login_that_fails_is_one_line(monkeypatch):
    from azure.core.exceptions import ClientAuthenticationError

    class NoLogin(FakeCredential):
        def get_token(self, *scopes, **options):
            raise ClientAuthenticationError("DefaultAzureCredential failed to retrieve a token ... (124 lines)")

        get_token_info = get_token

    client = fake_client(FakeAzureML(), NoLogin())
    monkeypatch.setattr("scripts.submit.workspace_client", lambda *ids: client)
    with pytest.raises(SystemExit) as exit:
        main(["configs/penguins.yaml", "--compute", "cpu-cluster"])
    assert exit.value.code == (
        "error: not signed in to Azure: run `az login` (or set AZURE_CLIENT_ID, AZURE_TENANT_ID and "
        "AZURE_CLIENT_SECRET for a service principal), then submit again"
    )


def test_a_job_azure_ml_refuses_is_one_line_naming_why(monkeypatch, capsys):
    class NoSuchCompute(FakeAzureML):
        def request(self, method, url, data=None, **kwargs):
            if method == "PUT" and re.search(r"/jobs/[^/]+$", url.split("?")[0]):
                error = {"code": "UserError", "message": "Compute cpu-clustr not found in workspace ws.\nDetails"}
                body = json.dumps({"error": error}).encode()
                return http_response(method, url, 400, body, {"Content-Type": "application/json"})
            return super().request(method, url, data, **kwargs)

    client = fake_client(NoSuchCompute())
    monkeypatch.setattr("scripts.submit.workspace_client", lambda *ids: client)
    with pytest.raises(SystemExit) as exit:
        main(["configs/penguins.yaml", "--compute", "cpu-clustr"])
    refused = "error: Azure ML refused the job: (UserError) Compute cpu-clustr not found in workspace ws."
    assert exit.value.code == refused
    assert "submitted" not in capsys.readouterr().out


NODES_PAST_CPU_CLUSTER = (
    "error: --nodes 8: the cluster cpu-cluster scales to at most 4 nodes; give 4 or fewer, or raise its maximum "
    "(az ml compute update --name cpu-cluster --max-instances 8)"
)


@pytest.mark.parametrize(
    "compute",
    ["cpu-cluster", "azureml:cpu-cluster", f"azureml:{WORKSPACE}/computes/cpu-cluster"],
    ids=["name", "azureml-name", "arm-id"],
)
def test_more_nodes_than_the_cluster_scales_to_is_one_line_before_anything_is_uploaded(compute, monkeypatch, capsys):
    """Azure ML takes such a job and queues it for good: the cluster's maximum, read from the workspace, bounds --nodes
    before the code snapshot or the environment goes up."""
    azure = FakeAzureML()
    client = fake_client(azure)
    monkeypatch.setattr("scripts.submit.workspace_client", lambda *ids: client)
    with pytest.raises(SystemExit) as exit:
        main(["configs/penguins.yaml", "--compute", compute, "--nodes", "8"])
    assert exit.value.code == NODES_PAST_CPU_CLUSTER
    assert [(method, path.rsplit("/ws/", 1)[1]) for method, path, _ in azure.requests] == [
        ("GET", "computes/cpu-cluster")
    ]
    assert azure.code_hashes == [] and azure.blobs == {} and capsys.readouterr().out == ""
    name = submit("configs/penguins.yaml", compute=compute, nodes=4)  # the cluster's maximum itself
    (job,) = [body["properties"] for method, path, body in azure.requests if path.endswith(f"/jobs/{name}")]
    assert job["resources"]["instanceCount"] == 4


def test_the_nodes_of_serverless_compute_a_cluster_the_workspace_lacks_or_a_dry_run_are_not_bounded(monkeypatch):
    """Serverless compute has no cluster to ask; a cluster the workspace lacks is Azure ML's refusal of the job, as
    before; a dry run asks nothing of the workspace."""
    monkeypatch.setattr("scripts.submit.workspace_client", lambda *ids: pytest.fail("Azure was asked"))
    text = submit("configs/penguins.yaml", compute="cpu-cluster", nodes=8, dry_run=True)
    assert yaml.safe_load(text)["resources"]["instance_count"] == 8
    azure = FakeAzureML()
    client = fake_client(azure)
    monkeypatch.setattr("scripts.submit.workspace_client", lambda *ids: client)
    name = submit("configs/penguins.yaml", compute="serverless", nodes=8)
    (job,) = [body["properties"] for method, path, body in azure.requests if path.endswith(f"/jobs/{name}")]
    assert job["resources"]["instanceCount"] == 8
    assert not [path for method, path, _ in azure.requests if "/computes/" in path]  # no cluster looked up
    name = submit("configs/penguins.yaml", compute="no-such-cluster", nodes=8)  # the fake takes it; Azure ML refuses
    (job,) = [body["properties"] for method, path, body in azure.requests if path.endswith(f"/jobs/{name}")]
    assert job["computeId"] == f"{WORKSPACE}/computes/no-such-cluster"


class OtherClusters(FakeAzureML):
    """A workspace with a cluster scaled to 0 nodes at most, and one the caller may not read."""

    def request(self, method, url, data=None, **kwargs):
        path = url.split("?")[0].removeprefix("https://management.azure.com")
        if method == "GET" and path.endswith("/computes/forbidden"):
            self.requests.append((method, path, None))
            message = "The client 'me' does not have authorization to perform action 'computes/read'.\nMore"
            body = json.dumps({"error": {"code": "AuthorizationFailed", "message": message}}).encode()
            return http_response(method, url, 403, body, {"Content-Type": "application/json"})
        if method == "GET" and path.endswith("/computes/none-yet"):
            self.requests.append((method, path, None))
            cluster = {"computeType": "AmlCompute", "properties": {"scaleSettings": {"maxNodeCount": 0}}}
            body = json.dumps({"id": path, "name": "none-yet", "properties": cluster}).encode()
            return http_response(method, url, 200, body, {"Content-Type": "application/json"})
        return super().request(method, url, data, **kwargs)


@pytest.mark.parametrize(
    ("compute", "line"),
    [
        (
            "none-yet",
            "--nodes 1: the cluster none-yet scales to at most 0 nodes; raise its maximum (az ml compute update --name "
            "none-yet --max-instances 1)",
        ),
        (
            "forbidden",
            "Azure ML refused to read the compute forbidden: (AuthorizationFailed) The client 'me' does not have "
            "authorization to perform action 'computes/read'.",
        ),
    ],
)
def test_a_cluster_of_no_nodes_or_one_the_login_may_not_read_is_one_line_before_the_upload(compute, line, monkeypatch):
    azure = OtherClusters()
    client = fake_client(azure)
    monkeypatch.setattr("scripts.submit.workspace_client", lambda *ids: client)
    with pytest.raises(SystemExit) as exit:
        main(["configs/penguins.yaml", "--compute", compute])
    assert exit.value.code == f"error: {line}"
    assert [method for method, *_ in azure.requests] == ["GET"] and azure.code_hashes == []


@pytest.mark.parametrize(
    ("presets", "train_args", "image"),
    [
        ([], "", BASE_IMAGE),
        (["configs/trainer/gpu.yaml"], "", GPU_IMAGE),
        ([], "--trainer.accelerator gpu", GPU_IMAGE),
        ([], "--trainer.accelerator 'gpu'", GPU_IMAGE),  # the job's shell takes the quotes off
        (["configs/trainer/gpu.yaml"], "--trainer.accelerator=cpu", BASE_IMAGE),
    ],
)
def test_the_image_follows_the_accelerator_in_the_dry_run_yaml(presets, train_args, image, tmp_path):
    from azure.ai.ml import load_job

    text = submit(
        "configs/mnist.yaml",
        compute="c",
        presets=presets,
        nodes=2,
        processes_per_node=2,
        train_args=train_args,
        dry_run=True,
    )
    (tmp_path / "job.yml").write_text(text)
    assert load_job(tmp_path / "job.yml").environment.image == image


def test_gpu_image_and_torch_pins_stay_in_step():
    """GPU_IMAGE gives the InfiniBand stack and Open MPI; torch brings CUDA 13 and NCCL from PyPI, which the README's
    driver requirement (R580+) is for: a torch of another CUDA major needs the requirement and this test changed."""
    import torch

    assert torch.version.cuda.split(".")[0] == "13"
    assert "R580" in (REPO / "README.md").read_text()
    pins = yaml.safe_load((REPO / "environment.yml").read_text())["dependencies"][-1]["pip"]
    assert f"torch=={torch.__version__.split('+')[0]}" in pins


def test_the_yaml_file_runs_from_anywhere_its_code_is_this_repository(tmp_path, monkeypatch, capsys):
    from azure.ai.ml import load_job

    target = tmp_path / "jobs" / "mnist.yml"
    target.parent.mkdir()
    gpu = ["configs/trainer/gpu.yaml"]
    submit("configs/mnist.yaml", compute="gpu", presets=gpu, nodes=2, processes_per_node=4, dry_run=True,
           yaml_file=str(target))  # fmt: skip
    assert yaml.safe_load(target.read_text())["code"] == os.path.relpath(REPO, target.parent)
    assert (
        yaml.safe_load(submit("configs/mnist.yaml", compute="gpu", dry_run=True))["code"] == "."
    )  # for job.yml at the root
    monkeypatch.chdir(tmp_path)  # `az ml job create -f jobs/mnist.yml` from another folder
    job = load_job(target)  # a relative code path is the YAML file's folder's, wherever az runs
    assert (target.parent / job.code).resolve() == REPO


def test_inputs_have_their_type_and_mode(tmp_path):
    (tmp_path / "penguins.csv").write_text("x\n")
    inputs = [
        "data.init_args.data_dir=azureml:mnist-v1.0:1",  # a folder unless told: no guess from '.0'
        f"data.init_args.path={tmp_path / 'penguins.csv'},mode=download",
        "model.network.init_args.weights_path=azureml://datastores/w/paths/resnet.pth,type=uri_file,mode=direct",
    ]
    job = build_job(["configs/penguins.yaml"], "cpu", inputs=inputs)
    found = {name: (given.type, given.mode) for name, given in job.inputs.items()}
    assert found == {
        "data_dir": ("uri_folder", "ro_mount"),
        "path": ("uri_file", "download"),
        "weights_path": ("uri_file", "direct"),
    }


def test_horovod_on_gpus_builds_the_gpu_dockerfile_on_the_gpu_image(horovod_context, tmp_path):
    job = build_job(["configs/mnist.yaml", HOROVOD, "configs/trainer/gpu.yaml"], "gpu", 2, 4, "mpi")
    context = horovod_context.with_name("horovod-image-gpu")
    assert Path(job.environment.build.path) == context
    sent = sorted(str(path.relative_to(context)) for path in context.rglob("*") if path.is_file())
    assert sent == ["Dockerfile", "environment.yml", "scripts/build_horovod.py"]
    dockerfile = (context / "Dockerfile").read_text()
    assert dockerfile == (REPO / "strategies/horovod/gpu.Dockerfile").read_text()
    assert f"FROM {GPU_IMAGE}" in dockerfile  # the CUDA Open MPI image with InfiniBand
    assert "RUN python /build/scripts/build_horovod.py --gpu" in dockerfile  # the build `make horovod-gpu` runs
    assert "--trainer.devices 4 --trainer.num_nodes 2" in job.command and job.distribution.type == "mpi"


def test_registered_assets_leave_nothing_but_the_code_to_upload(tmp_path, monkeypatch, capsys):
    from azure.ai.ml import load_job

    assets = {"environment": "azureml:lightning-training:1",
              "inputs": ["data.init_args.csv_path=azureml:penguins:3,type=uri_file"]}  # fmt: skip
    text = submit("configs/penguins.yaml", compute="cpu-cluster", dry_run=True, **assets)
    written = yaml.safe_load(text)
    assert written["environment"] == "azureml:lightning-training:1"  # no conda file, no image to build
    assert written["inputs"] == {"csv_path": {"mode": "ro_mount", "path": "azureml:penguins:3", "type": "uri_file"}}
    assert written["code"] == "."
    (tmp_path / "job.yml").write_text(text)
    loaded = load_job(tmp_path / "job.yml")
    assert loaded.environment.endswith("lightning-training:1") and loaded.inputs["csv_path"].type == "uri_file"
    assert "--data.init_args.csv_path ${{inputs.csv_path}}" in loaded.command

    azure = FakeAzureML()
    monkeypatch.setattr(
        requests.Session, "request", lambda session, method, url, *a, **k: azure.request(method, url, *a, **k)
    )
    client = fake_client(azure)
    monkeypatch.setattr("scripts.submit.workspace_client", lambda *ids: client)
    name = submit("configs/penguins.yaml", compute="cpu-cluster", **assets)
    puts = [path.removeprefix(WORKSPACE) for method, path, _ in azure.requests if method == "PUT"]
    assert puts == [f"/jobs/{name}"] and azure.blobs == {}  # the code snapshot is one the workspace has
    (job,) = [body["properties"] for method, path, body in azure.requests if path.endswith(f"/jobs/{name}")]
    assert job["environmentId"].endswith("/environments/lightning-training/versions/1")
    assert job["inputs"]["csv_path"]["uri"] == f"{WORKSPACE}/data/penguins/versions/3"
    assert job["inputs"]["csv_path"]["jobInputType"] == "uri_file"


@pytest.mark.parametrize(
    ("config", "options", "shm_size"),
    [
        ("configs/birds.yaml", {}, "2g"),  # 2 DataLoader workers, one process
        ("configs/birds.yaml", {"nodes": 2, "processes_per_node": 4}, "8g"),  # per node: 4 processes x 2 workers
        ("configs/birds.yaml", {"train_args": "--data.init_args.num_workers 6"}, "6g"),
        ("configs/birds.yaml", {"shm_size": "16g"}, "16g"),
        ("configs/penguins.yaml", {}, None),  # loads in the training process: Azure ML's own /dev/shm
        ("configs/birds.yaml", {"train_args": "--data.init_args.num_workers=0"}, None),
    ],
)
def test_the_shared_memory_follows_the_dataloader_workers(config, options, shm_size, tmp_path):
    from azure.ai.ml import load_job

    (tmp_path / "job.yml").write_text(submit(config, compute="c", dry_run=True, **options))
    assert load_job(tmp_path / "job.yml").resources.shm_size == shm_size


def test_tier_and_timeout_are_in_the_yaml_and_the_job_put(tmp_path, monkeypatch, capsys):
    from azure.ai.ml import load_job

    text = submit(
        "configs/birds.yaml",
        compute="gpu",
        presets=["configs/trainer/gpu.yaml"],
        tier="spot",
        timeout="1h30m",
        dry_run=True,
    )
    (tmp_path / "job.yml").write_text(text)
    job = load_job(tmp_path / "job.yml")
    assert (job.queue_settings.job_tier, job.limits.timeout) == ("spot", 5400)
    assert "--checkpoint_dir ${{outputs.checkpoints}}" in job.command  # where a preempted spot job resumes from
    azure = FakeAzureML()
    client = fake_client(azure)
    monkeypatch.setattr("scripts.submit.workspace_client", lambda *ids: client)
    name = submit("configs/birds.yaml", compute="gpu", tier="standard", timeout="7200")
    (sent,) = [body["properties"] for method, path, body in azure.requests if path.endswith(f"/jobs/{name}")]
    assert sent["queueSettings"]["jobTier"].lower() == "standard"
    assert sent["limits"]["timeout"] == "PT2H" and sent["resources"]["shmSize"] == "2g"


@pytest.mark.parametrize(
    ("given", "seconds"),
    [("3600", 3600), (3600, 3600), ("90m", 5400), ("4h", 14400), ("1h30m", 5400), ("2d", 172800), ("45s", 45)],
)
def test_a_timeout_is_seconds_or_a_duration(given, seconds):
    from scripts.azure_ml.option_values import parse_duration

    assert parse_duration(given) == seconds


@pytest.mark.parametrize("given", ["4 hours", "1h30", "30m1h", "", "0", "-5"])
def test_a_timeout_that_is_neither_is_refused(given):
    from scripts.azure_ml.option_values import parse_duration

    with pytest.raises(SubmitError, match="--timeout"):
        parse_duration(given)


def test_gpu_and_horovod_presets_in_either_order_give_one_gpu_job(horovod_context, tmp_path, capsys):
    """The Horovod preset sets its CPU build's accelerator; with the GPU preset the job is a GPU Horovod job whatever
    the order (the last config that sets a value wins, so the order alone decided, without a word)."""
    texts = [
        submit(
            "configs/mnist.yaml",
            compute="gpu",
            presets=presets,
            nodes=2,
            processes_per_node=4,
            distribution="mpi",
            dry_run=True,
        )
        for presets in (["configs/trainer/gpu.yaml", HOROVOD], [HOROVOD, "configs/trainer/gpu.yaml"])
    ]
    assert texts[0] == texts[1]
    job = yaml.safe_load(texts[0])
    assert Path(job["environment"]["build"]["path"]).name == "horovod-image-gpu"
    assert f"--config {HOROVOD} --config configs/trainer/gpu.yaml" in job["command"]  # gpu.yaml's accelerator wins


def local_paths(value, key: str = "") -> list[str]:
    """Every code, path and conda_file value of a job's YAML that names a local file or folder."""
    if isinstance(value, dict):
        return [path for name, item in value.items() for path in local_paths(item, name)]
    if isinstance(value, list):
        return [path for item in value for path in local_paths(item)]
    found = key in ("code", "path", "conda_file") and isinstance(value, str)
    return [value] if found and "://" not in value and not value.startswith("azureml:") else []


def test_every_path_in_a_written_yaml_is_relative_to_it_and_the_folder_is_made(horovod_context, tmp_path, capsys):
    """A Horovod job with a local input, written into a folder that does not exist yet: code, build context and input
    are relative to the YAML file, so it runs with `az ml job create -f` from any folder, on any machine with the
    checkout (absolute paths held this machine's)."""
    from azure.ai.ml import load_job

    data = tmp_path / "penguins.csv"
    data.write_text("x\n")
    target = tmp_path / "new" / "jobs" / "horovod.yml"
    submit("configs/penguins.yaml", compute="cpu", presets=[HOROVOD], nodes=2, processes_per_node=2, distribution="mpi",
           inputs=[f"data.init_args.csv_path={data}"],
           dry_run=True, yaml_file=str(target))  # fmt: skip
    written = yaml.safe_load(target.read_text())
    paths = local_paths(written)
    assert len(paths) == 3 and not [path for path in paths if os.path.isabs(path)], paths
    assert (target.parent / written["inputs"]["csv_path"]["path"]).resolve() == data
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    os.chdir(elsewhere)  # the autouse fixture's monkeypatch.chdir restores the folder
    loaded = load_job(target)
    assert (target.parent / loaded.environment.build.path).resolve() == horovod_context
    assert (target.parent / loaded.code).resolve() == REPO


def test_the_readme_multi_gpu_example_gets_the_gpu_image_and_one_without_the_preset_says_why_not(tmp_path, capsys):
    (line,) = [line for line in (REPO / "README.md").read_text().splitlines() if "--processes_per_node 4`" in line]
    assert "python -m scripts.submit configs/mnist.yaml --presets+ configs/trainer/gpu.yaml" in line
    gpu = ["configs/trainer/gpu.yaml"]
    text = submit("configs/mnist.yaml", compute="gpu-cluster", presets=gpu, nodes=2, processes_per_node=4, dry_run=True)
    assert yaml.safe_load(text)["environment"]["image"] == GPU_IMAGE
    assert capsys.readouterr().err == ""
    text = submit("configs/mnist.yaml", compute="gpu-cluster", nodes=2, processes_per_node=4, dry_run=True)
    assert yaml.safe_load(text)["environment"]["image"] == BASE_IMAGE
    assert capsys.readouterr().err.splitlines() == [
        "note: configs/mnist.yaml leaves trainer.accelerator to Lightning: the job gets the CPU image and 4 "
        "process(es) per node on CPUs; for GPUs add --presets+ configs/trainer/gpu.yaml"
    ]
    submit("configs/penguins.yaml", compute="cpu-cluster", dry_run=True)  # one process on a CPU cluster: nothing to say
    assert capsys.readouterr().err == ""


@pytest.mark.slow
def test_a_named_workspace_without_a_login_is_the_one_line_alone(tmp_path):
    """No Azure login anywhere (no az, no environment credentials, an empty home): azure-identity's 14 lines on the
    credentials it tried stay out; the project's line is all there is."""
    env = {key: value for key, value in os.environ.items() if not key.startswith(("AZURE_", "MSI_", "IDENTITY_"))}
    env |= {"HOME": str(tmp_path), "PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin"}
    ids = ["--subscription_id", "00000000-0000-0000-0000-000000000000", "--resource_group", "rg", "--workspace", "ws1"]
    result = run_module("scripts.submit", "configs/penguins.yaml", "--compute", "cpu-cluster", *ids, env=env)
    assert result.returncode == 1
    assert result.stderr.strip().splitlines() == [
        "error: not signed in to Azure: run `az login` (or set AZURE_CLIENT_ID, AZURE_TENANT_ID and "
        "AZURE_CLIENT_SECRET for a service principal), then submit again"
    ]


def test_serverless_compute_is_a_job_without_compute_on_the_instance_type_given(tmp_path, monkeypatch, capsys):
    """Azure ML's serverless compute is a job that names no compute (azure-ai-ml sends `serverless` on as a cluster's
    ARM id); --instance_type is its VM size, in the job's resources, and a sweep's trials'."""
    from azure.ai.ml import load_job

    gpu = ["configs/trainer/gpu.yaml"]
    text = submit(
        "configs/mnist.yaml",
        compute="serverless",
        presets=gpu,
        nodes=2,
        instance_type="Standard_NC4as_T4_v3",
        dry_run=True,
    )
    (tmp_path / "job.yml").write_text(text)
    loaded = load_job(tmp_path / "job.yml")
    assert loaded.compute is None
    assert (loaded.resources.instance_type, loaded.resources.instance_count) == ("Standard_NC4as_T4_v3", 2)
    assert loaded.environment.image == GPU_IMAGE
    capsys.readouterr()
    submit("configs/mnist.yaml", compute="serverless", instance_type="Standard_NC4as_T4_v3", dry_run=True)
    assert capsys.readouterr().err.startswith("note: configs/mnist.yaml leaves trainer.accelerator to Lightning")

    azure = FakeAzureML()
    client = fake_client(azure)
    monkeypatch.setattr("scripts.submit.workspace_client", lambda *ids: client)
    submit("configs/penguins.yaml", compute="Serverless")  # no VM size: Azure ML picks one
    submit(
        "configs/penguins.yaml",
        compute="serverless",
        sweep="configs/sweeps/penguins.yaml",
        instance_type="Standard_F4s_v2",
    )
    job, sweep = [body["properties"] for method, path, body in azure.requests if method == "PUT" and "/jobs/" in path]
    assert "computeId" not in job and "instanceType" not in job["resources"]
    assert sweep["jobType"] == "Sweep" and sweep.get("computeId") is None
    assert sweep["trial"]["resources"]["instanceType"] == "Standard_F4s_v2"


@pytest.mark.parametrize(
    ("args", "line"),
    [
        (
            ["--compute", "local"],
            "--compute local: Azure ML's local runs are not supported for these jobs; to train on this machine run "
            "python -m scripts.train fit --config configs/penguins.yaml, or give a compute cluster's name or "
            "serverless",
        ),
        (
            ["--compute", "cpu-cluster", "--instance_type", "Standard_DS3_v2"],
            "--instance_type Standard_DS3_v2: the VM size of serverless compute; the cluster cpu-cluster has its own: "
            "leave it out, or give --compute serverless",
        ),
        (
            ["--compute", "serverless", "--instance_type", "DS3_v2"],
            "--instance_type 'DS3_v2': give an Azure VM size such as Standard_DS3_v2",
        ),
        (
            ["--compute", "serverless", "--presets+", "configs/trainer/gpu.yaml"],
            "--compute serverless: the configs run on GPUs and serverless picks a CPU VM; give --instance_type a GPU "
            "size, e.g. Standard_NC4as_T4_v3",
        ),
        (
            ["--compute", "serverless", "--instance_type=Standard_DS3_v2", "--train_args=--trainer.accelerator gpu"],
            "--compute serverless: the configs run on GPUs and --instance_type Standard_DS3_v2 is a CPU size; give "
            "--instance_type a GPU size, e.g. Standard_NC4as_T4_v3",
        ),
        (
            ["--compute", "cpu cluster"],
            "--compute 'cpu cluster': not a compute's name; give a cluster's name (letters, digits and hyphens, e.g. "
            "cpu-cluster) or serverless",
        ),
        (["--compute", "gpu/cluster"], "--compute 'gpu/cluster': not a compute's name; give a cluster's name"),
        (
            ["--compute", "c", "--experiment", "penguins lr"],
            "--experiment 'penguins lr': Azure ML takes 1-256 letters, digits, '_' and '-', starting with a letter or "
            "digit; give --experiment NAME, e.g. penguins-lr",
        ),
        (
            ["--compute", "c", "--train_args", "--trainer.logger.init_args.experiment_name 'penguins/lr'"],
            "experiment 'penguins/lr' (the configs' logger's): Azure ML takes 1-256 letters",
        ),
        (
            ["--compute", "c", "--train_args", "--trainer.max_epochz 5"],
            "unrecognized arguments: --trainer.max_epochz 5 (check the name against --print_config)",
        ),
        (
            ["--compute", "c", "--sweep", "configs/sweeps/penguins.yaml", "--train_args", "--model.optimiser SGD"],
            "unrecognized arguments: --model.optimiser SGD (check the name against --print_config)",
        ),
        (
            ["--compute", "c", "--inputs+", "data.init_args.csv_pth=azureml:penguins:3,type=uri_file"],
            "unrecognized arguments: --data.init_args.csv_pth (datamodules.penguins.PenguinDataModule takes no such "
            "argument; check the name against --print_config)",
        ),
        (
            ["--compute", "cpu-cluster", "--environment", "azureml:lightning-serving:1"],
            "--environment azureml:lightning-serving:1: the serving environment (scripts/serving/environment.yml: no "
            "torch, no Lightning), where scripts.train cannot run; give the training one, e.g. "
            "azureml:lightning-training:1 (lightning-training-gpu for configs on GPUs)",
        ),
    ],
)
def test_a_job_azure_ml_would_refuse_or_fail_is_one_line_before_azure(args, line, monkeypatch, capsys):
    monkeypatch.setattr("scripts.submit.workspace_client", lambda *ids: pytest.fail("Azure was asked"))
    with pytest.raises(SystemExit) as exit:
        main(["configs/penguins.yaml", *args])
    assert exit.value.code.startswith(f"error: {line}")
    assert capsys.readouterr().out == ""


def test_a_multi_node_gpu_job_on_the_cpu_training_environment_says_its_nccl_goes_over_tcp(capsys):
    gpu, environment = ["configs/trainer/gpu.yaml"], "azureml:lightning-training:1"
    submit("configs/mnist.yaml", compute="gpu-cluster", presets=gpu, nodes=2, environment=environment, dry_run=True)
    assert capsys.readouterr().err.splitlines() == [
        "note: --environment azureml:lightning-training:1 is the training environment on the CPU image, without "
        "InfiniBand: NCCL between the 2 nodes goes over TCP; for GPU jobs register training-gpu (python -m "
        "scripts.assets environment training-gpu)"
    ]
    submit(
        "configs/mnist.yaml",
        compute="gpu",
        presets=gpu,
        nodes=2,
        environment="azureml:lightning-training-gpu:1",
        dry_run=True,
    )
    submit(
        "configs/mnist.yaml", compute="gpu-cluster", presets=gpu, environment=environment, dry_run=True
    )  # one node: no NCCL between
    assert capsys.readouterr().err == ""


def test_a_compute_named_as_azure_mls_yaml_names_it_is_the_cluster(monkeypatch, capsys):
    azure = FakeAzureML()
    client = fake_client(azure)
    monkeypatch.setattr("scripts.submit.workspace_client", lambda *ids: client)
    assert yaml.safe_load(submit("configs/penguins.yaml", compute="azureml:cpu-cluster", dry_run=True))["compute"] == (
        "azureml:cpu-cluster"
    )
    name = submit("configs/penguins.yaml", compute="azureml:cpu-cluster")
    (job,) = [body["properties"] for method, path, body in azure.requests if path.endswith(f"/jobs/{name}")]
    assert job["computeId"] == f"{WORKSPACE}/computes/cpu-cluster"  # not a cluster named "azureml:cpu-cluster"
    name = submit("configs/penguins.yaml", compute=f"azureml:{WORKSPACE}/computes/gpu-cluster")  # an ARM id too
    (job,) = [body["properties"] for method, path, body in azure.requests if path.endswith(f"/jobs/{name}")]
    assert job["computeId"] == f"{WORKSPACE}/computes/gpu-cluster"


def test_an_mltable_data_asset_is_the_table_task_s_input(tmp_path):
    """Azure ML's automated ML takes a data asset and a label column: the table task takes the same, an MLTable asset
    mounted as a folder that datamodules/table.py reads."""
    from azure.ai.ml import load_job

    inputs = ["data.init_args.csv_path=azureml:churn:2,type=mltable"]
    text = submit("configs/table.yaml", compute="cpu-cluster", dry_run=True, inputs=inputs,
                  train_args="--data.init_args.label churned")  # fmt: skip
    written = yaml.safe_load(text)
    assert written["inputs"] == {"csv_path": {"mode": "ro_mount", "path": "azureml:churn:2", "type": "mltable"}}
    (tmp_path / "job.yml").write_text(text)
    loaded = load_job(tmp_path / "job.yml")
    assert loaded.inputs["csv_path"].type == "mltable"
    assert "--data.init_args.csv_path ${{inputs.csv_path}}" in loaded.command
    assert "--data.init_args.label churned" in loaded.command


def spark_parts(folder: Path) -> Path:
    """A folder of Parquet part files as Spark writes them, with its _SUCCESS marker."""
    import pandas as pd

    folder.mkdir(parents=True)
    for part in range(2):
        pd.DataFrame({"x": [1.0, 2.0], "y": ["a", "b"]}).to_parquet(folder / f"part-0000{part}.snappy.parquet")
    (folder / "_SUCCESS").write_text("")
    return folder


def test_a_local_pattern_is_its_folder_uploaded_and_the_pattern_matched_by_the_task(tmp_path):
    """A glob of a lakehouse's part files: its folder goes up as a uri_folder, the job's command gives the pattern
    under the input's mount point, quoted so that the job's shell does not match it, and the CLI reads it here."""
    from azure.ai.ml import load_job

    lake = spark_parts(tmp_path / "lake" / "sales")
    inputs = [f"data.init_args.csv_path={lake}/part-*.parquet"]
    text = submit("configs/table.yaml", compute="cpu-cluster", dry_run=True, inputs=inputs,
                  train_args="--data.init_args.label y")  # fmt: skip
    written = yaml.safe_load(text)
    given = written["inputs"]["csv_path"]
    assert (given["type"], given["mode"], (REPO / given["path"]).resolve()) == ("uri_folder", "ro_mount", lake)
    (tmp_path / "job.yml").write_text(text)
    loaded = load_job(tmp_path / "job.yml")
    assert "--data.init_args.csv_path ${{inputs.csv_path}}/'part-*.parquet' " in loaded.command
    mounted = loaded.command.replace("${{inputs.csv_path}}", "/mnt/azureml/inputs/sales")  # as Azure ML writes it
    words = shlex.split(mounted)  # what the job's shell gives scripts.train: the pattern whole
    assert words[words.index("--data.init_args.csv_path") + 1] == "/mnt/azureml/inputs/sales/part-*.parquet"


@pytest.mark.parametrize(
    ("given", "line"),
    [
        ("{lake}/*.csv", "no file in {lake} matches *.csv; give a pattern that does"),
        ("{lake}/part-*.parquet,type=uri_file", "a pattern is uploaded as its folder, {lake}: give type=uri_folder"),
        ("{lake}/missing/*.parquet", "no such folder {lake}/missing"),
    ],
)
def test_a_local_pattern_that_cannot_be_uploaded_is_one_line(tmp_path, given, line):
    lake = spark_parts(tmp_path / "lake")
    item = "data.init_args.csv_path=" + given.format(lake=lake)
    with pytest.raises(SubmitError) as refused:
        submit("configs/table.yaml", compute="c", dry_run=True, inputs=[item], train_args="--data.init_args.label y")
    assert str(refused.value) == f"--inputs {item}: {line.format(lake=lake)}"


def test_a_pattern_in_train_args_matching_files_the_job_leaves_out_names_the_input(tmp_path, capsys):
    lake = spark_parts(tmp_path / "lake")
    pattern = f"{lake}/part-*.parquet"
    with pytest.raises(SystemExit) as exit:
        main(["configs/table.yaml", "--compute", "c", "--dry_run", "true",
              f"--train_args=--data.init_args.label y --data.init_args.csv_path {pattern}"])  # fmt: skip
    line = str(exit.value.code)
    assert line.startswith(f"error: data.init_args.csv_path {pattern}: a file here that the job's code leaves out")
    assert line.endswith(f"give it as an input: --inputs+ 'data.init_args.csv_path={pattern}'")  # quoted for a shell


def test_the_sdk_s_experimental_warnings_come_from_the_logger_the_commands_quiet():
    """Canary of the README's private names: scripts/azure_ml/options.py quiets the logger of azure-ai-ml's module
    `_utils._experimental` by name; renamed, its warnings would come back on every command."""
    import importlib.util
    import logging

    from scripts.azure_ml.options import run_command

    assert importlib.util.find_spec("azure.ai.ml._utils._experimental") is not None

    def command(name: str = "") -> None:
        """A command of one option."""

    with pytest.raises(SystemExit):
        run_command(command, "scripts.submit", (), args=["--no-such-option"])
    assert logging.getLogger("azure.ai.ml._utils._experimental").level == logging.ERROR
