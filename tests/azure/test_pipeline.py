"""scripts.pipeline: each task's components and its train -> evaluate -> register -> score pipeline, checked offline by
the real azure-ai-ml objects (every YAML through load_component / load_job, submissions through MLClient over the fake
transport of tests/azure/fake_azure.py) and run end to end here with --local true (penguins, and birds on a tiny folder
the test makes: no download).

    .venv/bin/python -m pytest -q tests/azure/test_pipeline.py
"""

from __future__ import annotations

import csv
import os
import subprocess
import sys
from pathlib import Path

import pytest
import requests
import yaml

from scripts.pipeline import main, pipeline
from tests.azure.fake_azure import WORKSPACE, FakeAzureML, fake_client
from tests.conftest import CLASSES, REPO, bird_folders, run_module, write_images

PENGUINS = REPO / "configs/examples/penguins.csv"
DESIGNER = {"epochs": 5, "batch_size": 16, "warmup_step_number": 0, "learning_rate": 0.001, "random_seed": 1,
            "patience": 3, "print_freq": 10}  # Train PyTorch Model's defaults  # fmt: skip


@pytest.fixture(autouse=True)
def at_repo_root(monkeypatch):
    monkeypatch.chdir(REPO)  # the steps' code is this folder; config paths are relative to it


@pytest.fixture(scope="module")
def birds_folder(tmp_path_factory) -> Path:
    return bird_folders(tmp_path_factory.mktemp("data") / "birds", count=2)


def test_each_tasks_components_read_back_with_load_component_from_another_folder(tmp_path, monkeypatch, capsys,
                                                                                 birds_folder):  # fmt: skip
    from azure.ai.ml import load_component

    for config in ("configs/penguins.yaml", "configs/birds.yaml"):
        folder = tmp_path / Path(config).stem
        pipeline(config, compute="c", components=True, version="2", dry_run=True, yaml_file=str(folder))
    monkeypatch.chdir(tmp_path)  # `az ml component create -f` from elsewhere: the code is still this repository
    birds = {step: load_component(tmp_path / "birds" / f"birds_{step}.yml") for step in
             ("train", "evaluate", "register", "score")}  # fmt: skip
    train = birds["train"]
    assert (train.name, train.version, (tmp_path / "birds" / train.code).resolve()) == ("birds_train", "2", REPO)
    assert {name: train.inputs[name].default for name in DESIGNER} == DESIGNER
    # Where a parameter means other than the designer's, the studio shows how in its description.
    assert "the designer's counts epochs" in train.inputs["warmup_step_number"].description
    learning_rate = train.inputs["learning_rate"].description
    assert "multiplied by the processes' count and decays polynomially" in learning_rate
    assert (train.inputs["training_data"].type, train.inputs["training_data"].optional) == ("uri_folder", True)
    assert {name: output.type for name, output in train.outputs.items()} == {
        "model": "mlflow_model", "checkpoints": "uri_folder", "metrics": "uri_folder"}  # fmt: skip
    assert train.outputs["checkpoints"].mode == "rw_mount"  # a restarted (preempted) step resumes from it
    assert "--checkpoint_dir ${{outputs.checkpoints}} --model_dir ${{outputs.model}}" in train.command
    assert birds["evaluate"].command.startswith("python -m scripts.train test --config configs/birds.yaml --ckpt_path")
    assert birds["score"].command == (
        "python -m scripts.score ${{inputs.model}} ${{inputs.data}} --output ${{outputs.predictions}}"
    )
    assert birds["register"].inputs["model_name"].default == "birds-classifier"
    assert birds["register"].is_deterministic is False and train.is_deterministic is False
    penguins = load_component(tmp_path / "penguins" / "penguins_train.yml")
    assert penguins.inputs["training_data"].type == "uri_file"  # the datamodule's csv_path
    assert {name: penguins.inputs[name].default for name in ("epochs", "batch_size", "random_seed", "patience")} == {
        "epochs": 100, "batch_size": 20, "random_seed": 42, "patience": 20}  # the config's own  # fmt: skip
    assert load_component(tmp_path / "penguins" / "penguins_score.yml").inputs["data"].type == "uri_file"


@pytest.mark.slow
def test_the_train_command_with_its_defaults_is_one_the_cli_accepts(tmp_path, birds_folder):
    from scripts.azure_ml.local_pipeline import local_command, step_inputs
    from scripts.azure_ml.pipelines import plan_pipeline

    plan = plan_pipeline(["configs/birds.yaml"], "c", data=str(tmp_path), train_args="--trainer.max_epochs 2",
                         score_data=str(birds_folder))  # fmt: skip
    inputs = step_inputs(plan, {})["train"] | {"patience": 7, "learning_rate": 0.01}
    outputs = {name: tmp_path / name for name in ("model", "checkpoints", "metrics")}
    args = local_command(plan.components.commands["train"], inputs, outputs)
    result = run_module("scripts.train", *args[3:], "--print_config")
    assert result.returncode == 0, result.stderr[-2000:]
    printed = yaml.safe_load(result.stdout)
    stopping, finetuning = printed["trainer"]["callbacks"]
    assert (stopping["init_args"]["patience"], finetuning["init_args"]["unfreeze_backbone_at_epoch"]) == (7, 2)
    assert printed["model"]["optimizer"]["init_args"]["lr"] == 0.01
    assert (printed["trainer"]["max_epochs"], printed["data"]["init_args"]["data_dir"]) == (2, str(tmp_path))


def test_the_pipeline_yaml_reads_back_with_load_job_its_steps_wired_and_set(tmp_path, capsys, birds_folder):
    from azure.ai.ml import load_job

    target = tmp_path / "jobs" / "birds.yml"  # in a folder not there yet: it is made
    pipeline("configs/birds.yaml", compute="gpu", nodes=2, processes_per_node=4, distribution="mpi",
             data=str(birds_folder), tier="spot", timeout="2h", dry_run=True, yaml_file=str(target))  # fmt: skip
    # 4 processes a node, the accelerator left to Lightning: scripts.submit's note that the steps get the CPU image
    assert "note: configs/birds.yaml leaves trainer.accelerator to Lightning: " in capsys.readouterr().err
    job = load_job(target)
    assert sorted(job.jobs) == ["evaluate", "register", "score", "train"]
    train = job.jobs["train"]
    assert (train.distribution.type, train.distribution.process_count_per_instance) == ("mpi", 4)
    assert (train.resources.instance_count, train.resources.shm_size) == (2, "8g")  # 4 processes x 2 workers
    assert train.inputs["launch_config"]._data == "configs/trainer/ddp_mpi.yaml"
    assert (train.inputs["nodes"]._data, train.inputs["processes_per_node"]._data) == (2, 4)
    assert train.environment_variables == {"OMPI_MCA_odls_base_sigkill_timeout": "10"}  # mpirun's SIGTERM grace
    assert train.inputs["training_data"]._data.path == str(birds_folder)  # a local folder, uploaded
    for step in job.jobs.values():
        assert (step.queue_settings.job_tier, step.limits.timeout) == ("spot", 7200)
        assert (target.parent / step.component.code).resolve() == REPO
    assert job.jobs["evaluate"].resources.shm_size == "2g"  # one process
    wiring = {(name, key): str(value._data.path if hasattr(value._data, "path") else value._data)
              for name, step in job.jobs.items() for key, value in step.inputs.items()}  # fmt: skip
    assert wiring[("evaluate", "checkpoints")] == "${{parent.jobs.train.outputs.checkpoints}}"
    assert wiring[("register", "model")] == "${{parent.jobs.train.outputs.model}}"
    assert wiring[("register", "metrics")] == "${{parent.jobs.evaluate.outputs.metrics}}"
    assert wiring[("score", "model")] == "${{parent.jobs.register.outputs.model}}"
    assert wiring[("score", "data")] == str(birds_folder)
    assert (job.compute, job.experiment_name) == ("gpu", "birds")


@pytest.mark.slow
def test_a_sweep_is_the_train_step(capsys, tmp_path, birds_folder):
    """A sweep node over the train step, its trials on the step's nodes, processes, shared memory and VM size (the
    SDK's sweep node takes the component alone), on the pipeline's serverless compute."""
    from azure.ai.ml import load_job

    text = pipeline("configs/birds.yaml", compute="serverless", data=str(birds_folder),
                    sweep="configs/sweeps/birds.yaml",
                    tier="spot", nodes=2, processes_per_node=4, instance_type="Standard_NC4as_T4_v3",
                    dry_run=True)  # fmt: skip
    (tmp_path / "sweep.yml").write_text(text)
    job = load_job(tmp_path / "sweep.yml")
    train = job.jobs["train"]
    assert (train.type, train.objective.primary_metric, train.limits.max_total_trials) == ("sweep", "val_acc", 12)
    assert (train.resources.instance_count, train.resources.shm_size) == (2, "8g")  # 4 processes x 2 workers
    assert (train.compute, train.resources.instance_type) == (None, "Standard_NC4as_T4_v3")  # serverless's VM size
    assert (train.trial.distribution.type, train.trial.distribution.process_count_per_instance) == ("pytorch", 4)
    assert set(train.search_space) == {"model_optimizer_init_args_lr", "model_optimizer_init_args_momentum",
                                       "data_init_args_batch_size", "model_warmup_steps"}  # fmt: skip
    assert "--model.optimizer.init_args.lr ${{inputs.model_optimizer_init_args_lr}}" in train.trial.command
    assert train.queue_settings.job_tier == "spot"
    assert str(job.jobs["evaluate"].inputs["checkpoints"]._data.path) == "${{parent.jobs.train.outputs.checkpoints}}"


@pytest.mark.slow
def test_a_sweep_under_mpi_says_its_trials_lack_the_stop_grace(tmp_path, monkeypatch, capsys):
    """Azure ML's sweep node takes no environment variables, so OMPI_MCA_odls_base_sigkill_timeout, which the train
    step has, does not reach its trials: said, for DDP under mpi; Horovod's image carries it
    (tests/azure/test_submit.py)."""
    monkeypatch.setattr("scripts.azure_ml.images.HOROVOD_CONTEXT", tmp_path / "horovod-image")  # not outputs/
    common = {"score_data": str(PENGUINS), "sweep": "configs/sweeps/penguins.yaml", "nodes": 2, "processes_per_node": 2,
              "dry_run": True}  # fmt: skip
    for presets, distribution, said in [([], "mpi", True), ([], "pytorch", False),
                                        (["configs/trainer/horovod.yaml"], "mpi", False)]:  # fmt: skip
        text = pipeline("configs/penguins.yaml", compute="cpu", presets=presets, distribution=distribution, **common)
        assert "environment_variables" not in yaml.safe_load(text)["jobs"]["train"]  # the SDK's sweep node has none
        note = "note: a pipeline's sweep trials take no environment variables, so under --distribution mpi Open MPI "
        assert (note in capsys.readouterr().err) == said, (presets, distribution)
    steps = yaml.safe_load(
        pipeline("configs/penguins.yaml", compute="cpu", distribution="mpi", **{**common, "sweep": None})
    )
    assert steps["jobs"]["train"]["environment_variables"] == {"OMPI_MCA_odls_base_sigkill_timeout": "10"}


def test_the_steps_read_the_configs_in_the_order_their_image_was_chosen_by(tmp_path, monkeypatch, capsys):
    """A GPU preset given before Horovod's, whose config sets the CPU build's accelerator: the steps read Horovod's
    first, as scripts.submit's job does, so the GPU preset wins in them as it did in choosing the GPU image."""
    monkeypatch.setattr("scripts.azure_ml.images.HOROVOD_CONTEXT", tmp_path / "horovod-image")  # not outputs/
    presets = ["configs/trainer/gpu.yaml", "configs/trainer/horovod.yaml"]
    text = pipeline("configs/penguins.yaml", compute="gpu", presets=presets, score_data=str(PENGUINS), dry_run=True)
    steps = yaml.safe_load(text)["jobs"]
    order = "--config configs/penguins.yaml --config configs/trainer/horovod.yaml --config configs/trainer/gpu.yaml"
    assert order in steps["train"]["component"]["command"] and order in steps["evaluate"]["component"]["command"]
    assert steps["train"]["component"]["environment"]["build"]["path"] == str(tmp_path / "horovod-image-gpu")


def fake_workspace(monkeypatch) -> FakeAzureML:
    azure = FakeAzureML()
    monkeypatch.setattr(
        requests.Session, "request", lambda session, method, url, *a, **k: azure.request(method, url, *a, **k)
    )
    client = fake_client(azure)
    monkeypatch.setattr("scripts.pipeline.workspace_client", lambda *ids: client)
    return azure


def test_local_data_the_workspaces_storage_cannot_take_is_one_line_not_azure_mls_refusal(monkeypatch, capsys):
    """Its storage out of this machine's reach, a pipeline of local data ended in 'error: Azure ML refused the
    pipeline: ' and an ANSI colour code, after ~100 s of the SDK's retries."""
    from tests.azure.fake_azure import UnreachableStorage

    azure = UnreachableStorage("dns")
    monkeypatch.setattr(
        requests.Session, "request", lambda session, method, url, *a, **k: azure.request(method, url, *a, **k)
    )
    client = fake_client(azure)
    monkeypatch.setattr("scripts.pipeline.workspace_client", lambda *ids: client)
    with pytest.raises(SystemExit) as exit:
        main(["configs/penguins.yaml", "--compute", "cpu-cluster", "--data", str(PENGUINS)])
    assert exit.value.code.startswith(
        "error: this machine cannot reach the workspace's storage, https://account.blob.core.windows.net (Failed to "
        f"resolve 'account.blob.core.windows.net' ([Errno -2] Name or service not known)), where --data {PENGUINS} "
        "would be uploaded; check this machine's network"
    ), exit.value.code
    assert azure.storage_requests == 1 and not [path for method, path, _ in azure.requests if method == "PUT"]
    assert capsys.readouterr().out == ""


def test_the_sdks_colour_codes_never_reach_a_refusals_line():
    from scripts.pipeline import refusal

    coloured = "\n\x1b[37m\n\x1b[30m\n1) One or more fields are invalid\x1b[39m\x1b[39m\n\nDetails: \n"
    assert refusal(coloured) == "1) One or more fields are invalid"


@pytest.mark.slow
def test_a_submission_puts_the_pipeline_with_its_four_steps(monkeypatch, capsys):
    azure = fake_workspace(monkeypatch)
    name = pipeline("configs/penguins.yaml", compute="azureml:cpu-cluster", data="azureml:penguins:3", threshold=0.95,
                    environment="azureml:lightning-training:1", tier="spot")  # fmt: skip
    assert capsys.readouterr().out.endswith(f"submitted {name}: https://ml.azure.com/runs/fake\n")
    (job,) = [body["properties"] for method, path, body in azure.requests if path.endswith(f"/jobs/{name}")]
    assert job["jobType"] == "Pipeline" and sorted(job["jobs"]) == ["evaluate", "register", "score", "train"]
    assert job["jobs"]["train"]["inputs"]["training_data"]["uri"] == f"{WORKSPACE}/data/penguins/versions/3"
    assert job["jobs"]["register"]["inputs"]["threshold"]["value"] == "0.95"
    assert job["jobs"]["score"]["inputs"]["model"]["value"] == "${{parent.jobs.register.outputs.model}}"
    components = [path for method, path, _ in azure.requests if method == "PUT" and "/components/" in path]
    assert len(components) == 4  # the steps' components, anonymous
    assert all(step["queue_settings"]["job_tier"].lower() == "spot" for step in job["jobs"].values())
    assert job["computeId"] == f"{WORKSPACE}/computes/cpu-cluster"


def test_serverless_compute_is_the_pipelines_default_on_the_vm_size_each_step_needs(monkeypatch, capsys):
    """Azure ML's documented way for a pipeline: serverless as its settings' default compute. --instance_type is the
    VM size of train and evaluate (both run the GPU config); register and score run on CPUs: with a GPU size given,
    theirs is left to Azure ML, which picks a CPU one."""
    azure = fake_workspace(monkeypatch)
    name = pipeline("configs/birds.yaml", compute="serverless", presets=["configs/trainer/gpu.yaml"], nodes=2,
                    data="azureml:birds:1",
                    environment="azureml:lightning-training-gpu:1", instance_type="Standard_NC4as_T4_v3")  # fmt: skip
    (job,) = [body["properties"] for method, path, body in azure.requests if path.endswith(f"/jobs/{name}")]
    assert "computeId" not in job and job["settings"]["default_compute"] == f"{WORKSPACE}/computes/serverless"
    sizes = {step: (body.get("resources") or {}).get("instance_type") for step, body in job["jobs"].items()}
    gpu = "Standard_NC4as_T4_v3"
    assert sizes == {"train": gpu, "evaluate": gpu, "register": None, "score": None}
    assert job["jobs"]["train"]["resources"]["instance_count"] == 2
    assert not [path for method, path, _ in azure.requests if "/computes/" in path]  # no cluster looked up


def test_a_compute_the_workspace_does_not_have_is_one_line(monkeypatch, capsys):
    fake_workspace(monkeypatch)
    with pytest.raises(SystemExit) as exit:
        main(["configs/penguins.yaml", "--compute", "no-such-cluster", "--score_data", str(PENGUINS)])
    assert exit.value.code.startswith("error: Azure ML refused the pipeline: compute azureml:no-such-cluster: ")
    assert "\n" not in exit.value.code


@pytest.mark.parametrize("sweep", [None, "configs/sweeps/penguins.yaml"], ids=["train", "sweep"])
def test_a_train_step_of_more_nodes_than_the_cluster_scales_to_is_one_line_before_anything_is_put(monkeypatch, sweep):
    azure = fake_workspace(monkeypatch)
    args = ["configs/penguins.yaml", "--compute", "cpu-cluster", "--nodes", "6", "--score_data", str(PENGUINS)]
    with pytest.raises(SystemExit) as exit:
        main([*args, *(["--sweep", sweep] if sweep else [])])
    assert exit.value.code == (
        "error: --nodes 6: the cluster cpu-cluster scales to at most 4 nodes; give 4 or fewer, or raise its maximum "
        "(az ml compute update --name cpu-cluster --max-instances 6)"
    )
    assert [method for method, *_ in azure.requests] == ["GET"] and azure.code_hashes == []


def test_the_components_are_registered_in_the_workspace(monkeypatch, capsys):
    azure = fake_workspace(monkeypatch)
    created = pipeline("configs/birds.yaml", compute="gpu", components=True, version="3")
    assert created.split() == [f"azureml:birds_{step}:3" for step in ("train", "evaluate", "register", "score")]
    puts = [path.removeprefix(WORKSPACE) for method, path, _ in azure.requests if method == "PUT"]
    assert [path for path in puts if path.startswith("/components/")] == [
        f"/components/birds_{step}/versions/3" for step in ("train", "evaluate", "register", "score")]  # fmt: skip


# The mistakes found by checking the configs through the training CLI, which imports Lightning (~7 s a process): in
# make test, not in make test-fast.
LIGHTNING = pytest.mark.slow


@pytest.mark.parametrize(
    ("args", "line"),
    [
        (["configs/nope.yaml", "--compute", "c"], "configs/nope.yaml: no such config in this folder"),
        (["configs/penguins.yaml"], "give the compute cluster to run on: --compute NAME (or --local true"),
        (["configs/penguins.yaml", "--compute", "local"], "--compute local: Azure ML's local runs are not supported "
         "for pipelines; give --local true to run it here step after step, or a compute cluster's name"),
        (["configs/penguins.yaml", "--compute", "cpu cluster"], "--compute 'cpu cluster': not a compute's name"),
        pytest.param(["configs/penguins.yaml", "--compute", "c", "--score_data", str(PENGUINS), "--experiment",
                      "penguins lr"], "--experiment 'penguins lr': Azure ML takes 1-256 letters, digits, '_' and '-'",
                     marks=LIGHTNING),
        (["configs/penguins.yaml", "--compute", "c", "--threshold", "1.5"],
         "--threshold 1.5: test_acc is a fraction; give 0 to 1"),
        (["configs/penguins.yaml", "--compute", "c", "--metric", "test_loss", "--threshold", "-1"],
         "--threshold -1.0: test_loss is 0 or more"),
        (["configs/penguins.yaml", "--compute", "c", "--metric", "val_acc"], "--metric 'val_acc': give test_acc or"),
        (["configs/penguins.yaml", "--compute", "c", "--nodes", "0"], "--nodes 0 --processes_per_node 1: both must"),
        (["configs/penguins.yaml", "--compute", "c", "--processes_per_node", "two"], "--processes_per_node"),
        (["configs/penguins.yaml", "--compute", "c", "--name", "Penguins-v2"],
         "--name 'Penguins-v2': Azure ML refuses it as a component name's start"),
        (["configs/penguins.yaml", "--compute", "c", "--model_name", "my/model"], "--model_name 'my/model': Azure ML"),
        (["configs/penguins.yaml", "--compute", "c", "--tier", "cheap"], "--tier: 'cheap' is not a valid value"),
        (["configs/penguins.yaml", "--compute", "c", "--components", "true"],
         "--version is missing: give the version to create"),
        (["configs/penguins.yaml", "--compute", "c", "--version", "2"], "--version is the components' version"),
        (["configs/penguins.yaml", "--local", "true", "--dry_run", "true"], "--local true runs the pipeline here"),
        (["configs/penguins.yaml", "--local", "true", "--local_dir", "README.md/runs", "--score_data", str(PENGUINS)],
         "--local_dir README.md/runs: README.md is a file, not a folder; give a folder"),
        pytest.param(["configs/penguins.yaml", "--compute", "c", "--data", "configs"],
                     "--data configs: a folder; this task reads", marks=LIGHTNING),
        pytest.param(["configs/birds.yaml", "--compute", "c", "--data", "configs/birds.yaml"],
                     "--data configs/birds.yaml: a file; this task reads a folder", marks=LIGHTNING),
        (["configs/birds.yaml", "--compute", "c", "--data", "no/such"], "--data no/such: no such file or folder"),
        pytest.param(["configs/birds.yaml", "--compute", "c", "--score_data", "strategies"],
                     "--score_data strategies: no image in it", marks=LIGHTNING),
        pytest.param(["configs/penguins.yaml", "--compute", "c"],
                     "--score_data: give what the score step scores (a CSV", marks=LIGHTNING),
        pytest.param(["configs/birds.yaml", "--compute", "c", "--data", "azureml:birds"],
                     "--data 'azureml:birds': give a", marks=LIGHTNING),
        (["configs/penguins.yaml", "--compute", "c", "--sweep", "configs/sweeps/penguins.yaml", "--timeout", "1h"],
         "--timeout with --sweep"),
        (["configs/penguins.yaml", "--compute", "c", "--dry_run", "true", "--yaml_file", "configs"],
         "--yaml_file configs: a folder; give a file name in it, e.g. configs/job.yml"),
        (["configs/penguins.yaml", "--compute", "c", "--dry_run", "true", "--yaml_file", "README.md/job.yml"],
         "--yaml_file README.md/job.yml: README.md is a file, not a folder"),
        (["configs/penguins.yaml", "--components", "true", "--version", "1", "--dry_run", "true", "--yaml_file",
          "README.md"], "--yaml_file README.md: README.md is a file, not a folder; give a folder, e.g. components/"),
    ],
)  # fmt: skip
def test_a_mistake_is_one_line_before_the_azure_sdk_is_imported(args, line):
    command = [sys.executable, "-X", "importtime", "-m", "scripts.pipeline", *args]
    result = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=120)
    messages = [text for text in result.stderr.splitlines() if not text.startswith("import time:")]
    assert result.returncode == 1 and len(messages) == 1 and messages[0].startswith(f"error: {line}"), messages
    imported = [text.rsplit("|", 1)[-1].strip() for text in result.stderr.splitlines() if text.startswith("import")]
    assert not [name for name in imported if name.startswith("azure")]


@pytest.mark.parametrize("option", ["--data", "--test_data", "--score_data"])
def test_a_data_path_that_is_not_there_is_one_line_before_the_training_cli_is_imported(option):
    """Every other mistake is found in about a second; the configs' check through the training CLI imports Lightning
    (tens of seconds on a busy machine): a mistyped path is named before it."""
    args = ["configs/penguins.yaml", "--compute", "c", option, "no/such.csv"]
    result = subprocess.run([sys.executable, "-X", "importtime", "-m", "scripts.pipeline", *args], cwd=REPO,
                            capture_output=True, text=True, timeout=120)  # fmt: skip
    messages = [text for text in result.stderr.splitlines() if not text.startswith("import time:")]
    assert result.returncode == 1 and messages == [f"error: {option} no/such.csv: no such file or folder; give the "
                                                   "data as the task reads it"]  # fmt: skip
    imported = [text.rsplit("|", 1)[-1].strip() for text in result.stderr.splitlines() if text.startswith("import")]
    assert not [name for name in imported if name.split(".")[0] in ("lightning", "torch", "azure")]


def test_a_score_folder_with_only_what_scripts_score_leaves_out_is_refused_before_any_step(tmp_path, birds_folder):
    """.DS_Store and Thumbs.db are no images; a photo without a suffix is one (by its bytes)."""
    from scripts.azure_ml.errors import SubmitError
    from scripts.azure_ml.pipelines import plan_pipeline

    folder = tmp_path / "to-score"
    (folder / "__MACOSX").mkdir(parents=True)
    (folder / ".DS_Store").write_bytes(b"\0\0\0\1Bud1")
    (folder / "Thumbs.db").write_bytes(b"\xd0\xcf")
    photo = next(path for path in birds_folder.rglob("*") if path.is_file())
    (folder / "__MACOSX" / "photo.jpg").write_bytes(photo.read_bytes())
    with pytest.raises(SubmitError, match=f"--score_data {folder}: no image in it"):
        plan_pipeline(["configs/birds.yaml"], "c", data=str(birds_folder), score_data=str(folder))
    (folder / "photo").write_bytes(photo.read_bytes())  # no suffix: an image by its bytes
    assert plan_pipeline(["configs/birds.yaml"], "c", data=str(birds_folder), score_data=str(folder)).score_data


@pytest.mark.slow  # over 7 s of a worker: make test-fast stays under 2 minutes
def test_a_yaml_file_that_is_not_a_jobs_yaml_is_refused_not_written_over(tmp_path):
    config = tmp_path / "penguins.yaml"  # a config of the user's, given as --yaml_file by mistake
    config.write_text((REPO / "configs/penguins.yaml").read_text())
    before = config.read_bytes()
    for module in ("scripts.pipeline", "scripts.submit"):
        args = ["configs/penguins.yaml", "--compute", "c", "--score_data", str(PENGUINS), "--dry_run", "true"]
        args = args if module == "scripts.pipeline" else args[:3] + args[5:]
        result = run_module(module, *args, "--yaml_file", str(config))
        assert result.returncode == 1 and result.stderr.strip() == (
            f"error: --yaml_file {config}: a file that is not an Azure ML job's YAML is there, and it would be written "
            f"over; give a new file name, e.g. {tmp_path / 'job.yml'}"
        ), result.stderr[-2000:]
        assert config.read_bytes() == before
        job = tmp_path / f"{module}.yml"  # a job's YAML written before is replaced
        for _ in range(2):
            result = run_module(module, *args, "--yaml_file", str(job))
            assert result.returncode == 0, result.stderr[-2000:]


@pytest.mark.slow  # ~15 s of a worker: make test-fast stays under 2 minutes
def test_a_data_file_whose_name_the_steps_shell_would_split_is_one_line_here_too(tmp_path):
    # Uploaded, the file keeps its name, which ends the path Azure ML writes into the step's command unquoted.
    data = tmp_path / "my data" / "penguins 2024.csv"  # a space in the folder is fine: the upload drops it
    data.parent.mkdir()
    data.write_text(PENGUINS.read_text())
    why = (
        "Azure ML writes the uploaded file's path, 'penguins 2024.csv' at its end, into the job's command as it is, "
        "where a shell would split it; give a copy whose name has no spaces, quotes or shell characters"
    )
    local = ["--local", "true", "--local_dir", str(tmp_path / "outputs")]
    for module, args, option in (
        ("scripts.pipeline", ["--compute", "c", "--data", str(data), "--dry_run", "true"], f"--data {data}"),
        ("scripts.pipeline", [*local, "--score_data", str(data)], f"--score_data {data}"),
        ("scripts.submit", ["--compute", "c", "--inputs+", f"data.init_args.csv_path={data}", "--dry_run", "true"],
         f"--inputs data.init_args.csv_path={data}"),
    ):  # fmt: skip
        result = run_module(module, "configs/penguins.yaml", *args)
        assert result.returncode == 1 and result.stderr.strip() == f"error: {option}: {why}", result.stderr[-2000:]
    assert not (tmp_path / "outputs").exists()
    data.rename(data.with_name("penguins.csv"))
    result = run_module("scripts.pipeline", "configs/penguins.yaml", "--compute", "c", "--data",
                        str(data.with_name("penguins.csv")), "--dry_run", "true")  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]


@pytest.mark.slow  # over 7 s of a worker: make test-fast stays under 2 minutes
def test_a_local_run_started_in_the_same_second_as_another_gets_a_folder_of_its_own(tmp_path, monkeypatch):
    from types import SimpleNamespace

    from scripts.azure_ml import local_pipeline
    from scripts.azure_ml.errors import SubmitError
    from scripts.azure_ml.pipelines import plan_pipeline

    monkeypatch.setattr(local_pipeline, "time", SimpleNamespace(strftime=lambda form: "20260101-120000"))
    taken = tmp_path / "pipelines" / "penguins-20260101-120000"
    (taken / "train").mkdir(parents=True)  # the other run's
    plan = plan_pipeline(["configs/penguins.yaml"], "", train_args="--trainer.max_epochs 0", score_data=str(PENGUINS))
    with pytest.raises(SubmitError) as error:  # a fit of 0 epochs: its train step fails at once
        local_pipeline.run_local(plan, tmp_path)
    assert str(error.value).endswith(f"its folders in {taken}-2")
    assert sorted(path.name for path in taken.iterdir()) == ["train"]


def registered_versions(store: Path, name: str) -> list[str]:
    from mlflow import MlflowClient
    from mlflow.exceptions import MlflowException

    try:
        return [str(v.version) for v in MlflowClient(f"sqlite:///{store}").search_model_versions(f"name = '{name}'")]
    except MlflowException:
        return []


def run_folder(stdout: str) -> Path:
    line = next(line for line in stdout.splitlines() if line.startswith("pipeline done: "))
    return Path(line.removeprefix("pipeline done: ").split(" (")[0])


@pytest.mark.slow
def test_penguins_run_here_end_to_end_registering_only_above_the_threshold(tmp_path):
    """A run whose model misses the threshold says, at its end, that it registered nothing and why; the register step
    run again on its folders with a threshold reached registers it."""
    local = ["configs/penguins.yaml", "--local", "true", "--local_dir", tmp_path, "--score_data", PENGUINS,
             "--train_args", "--trainer.max_epochs=3", "--model_name", "penguins-pipeline"]  # fmt: skip
    result = run_module("scripts.pipeline", *local, "--metric", "test_loss", "--threshold", "0")
    assert result.returncode == 0, result.stderr[-3000:]
    folder = run_folder(result.stdout)
    for step in ("train", "evaluate", "register", "score"):
        assert f"[{step}] python -m scripts." in result.stdout
    assert "--trainer.max_epochs=3" in result.stdout  # given as the next argument, though it starts with a dash
    assert (folder / "train/model/MLmodel").is_file() and (folder / "train/checkpoints/best.ckpt").is_file()
    metrics = yaml.safe_load((folder / "evaluate/metrics/metrics.json").read_text())
    assert set(metrics) >= {"test_acc", "test_loss"} and 0 <= metrics["test_acc"] <= 1
    assert result.stdout.strip().splitlines()[-1] == (
        f"registered nothing: test_loss {metrics['test_loss']:.4f} does not reach --threshold 0 (at most); the "
        "predictions are the unregistered model's"
    )
    assert registered_versions(tmp_path / "mlflow.db", "penguins-pipeline") == []
    rows = list(csv.reader((folder / "score/predictions/predictions.csv").read_text().splitlines()))
    assert rows[0] == ["input", "class", "probability"] and len(rows) == len(PENGUINS.read_text().splitlines())
    assert (folder / "train/outputs").is_dir()  # the step's ./outputs, as Azure ML keeps it: its run's config
    # The evaluate step's report: in its ./outputs, which Azure ML keeps for the step, and in its MLflow run.
    (report,) = (folder / "evaluate/outputs").glob("*/*/evaluation")
    from mlflow import MlflowClient

    listed = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}").list_artifacts(report.parent.name, "evaluation")
    names = ("confusion_matrix.png", "confusion_matrix.csv", "per_class.csv")
    assert {artifact.path for artifact in listed} == {f"evaluation/{name}" for name in names}

    # The register step again, as its own process on the same folders and store, with a threshold reached.
    step = [folder / "train/model", folder / "evaluate/metrics", "--name", "penguins-pipeline", "--threshold", "0"]
    store = {**os.environ, "MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path / 'mlflow.db'}"}
    again = run_module("scripts.azure_ml.register_step", *step, "--output", tmp_path / "passed-on", env=store)
    assert again.returncode == 0, again.stderr[-3000:]
    assert f"registered model: penguins-pipeline version 1 (test_acc {metrics['test_acc']:.4f}" in again.stdout
    assert registered_versions(tmp_path / "mlflow.db", "penguins-pipeline") == ["1"]
    assert (tmp_path / "passed-on/MLmodel").is_file()  # the model goes on to the score step all the same


@pytest.mark.slow
def test_birds_run_here_end_to_end_on_a_tiny_folder(tmp_path):
    data = bird_folders(tmp_path / "birds", splits=("train", "val", "test"), count=2)
    write_images(tmp_path / "photos", 3, 1, size=(40, 60))
    args = "--data.init_args.image_size 32 --data.init_args.archive null --data.init_args.num_workers 0"
    result = run_module(
        "scripts.pipeline", "configs/birds.yaml", "--local", "true", "--local_dir", tmp_path, "--data", data,
        "--score_data", tmp_path / "photos", "--threshold", "0", "--train_args", f"--trainer.max_epochs 1 {args}",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    folder = run_folder(result.stdout)
    assert "registered model: birds-classifier version 1" in result.stdout
    rows = list(csv.reader((folder / "score/predictions/predictions.csv").read_text().splitlines()))
    assert len(rows) == 4 and all(row[1] in CLASSES for row in rows[1:])
    assert "--data.init_args.image_size 32" in next(line for line in result.stdout.splitlines()
                                                    if line.startswith("[evaluate]"))  # fmt: skip


@pytest.mark.slow
def test_a_fit_restarted_after_saving_its_model_replaces_it_and_a_folder_of_other_files_is_refused(tmp_path, train_cli):
    """A pipeline's train step restarted (preempted) after it saved its model output resumes and saves it again."""
    fit = ["fit", "--config", "configs/penguins.yaml", "--trainer.max_epochs", "1", "--checkpoint_dir",
           tmp_path / "checkpoints", "--model_dir", tmp_path / "model", "--test_after_fit", "false"]  # fmt: skip
    first = train_cli(*fit)
    assert first.returncode == 0, first.stderr[-3000:]
    saved = (tmp_path / "model/MLmodel").read_text()
    again = train_cli(*fit)  # the same outputs: it resumes from last.ckpt and saves the model again
    assert again.returncode == 0, again.stderr[-3000:]
    assert f"saved model: {tmp_path / 'model'}" in again.stdout and (tmp_path / "model/MLmodel").read_text() != saved
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine/notes.txt").write_text("mine")
    refused = train_cli(*fit[:-4], "--model_dir", tmp_path / "mine")
    assert refused.stderr.strip().splitlines()[-1] == (
        f"error: --model_dir {tmp_path / 'mine'}: neither empty nor an MLflow model's folder; give a new or empty one "
        "(nothing in it is replaced)"
    )
    assert (tmp_path / "mine/notes.txt").read_text() == "mine"


def test_the_register_step_refuses_what_it_cannot_use_in_one_line(tmp_path, monkeypatch):
    from scripts.azure_ml.register_step import main as register

    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")  # a registration lands here

    (tmp_path / "model").mkdir()
    with pytest.raises(SystemExit) as exit:
        register([str(tmp_path / "model"), str(tmp_path), "--name", "m", "--threshold", "0.5"])
    assert exit.value.code.startswith(f"error: {tmp_path / 'model'}: no MLmodel in it")
    (tmp_path / "model" / "MLmodel").write_text("flavors: {}\n")
    (tmp_path / "metrics.json").write_text('{"test_loss": 0.2}')
    with pytest.raises(SystemExit) as exit:
        register([str(tmp_path / "model"), str(tmp_path), "--name", "m", "--threshold", "0.5"])
    assert (
        exit.value.code
        == f"error: {tmp_path / 'metrics.json'}: no test_acc in it (it has test_loss); give one of those"
    )
    (tmp_path / "metrics.json").write_text('{"test_acc": 0.9}')
    for name in ("penguins classifier", "m" * 256):  # what MLflow's registry, or Azure ML's, refuses after the files
        with pytest.raises(SystemExit) as exit:
            register([str(tmp_path / "model"), str(tmp_path), "--name", name, "--threshold", "0.5"])
        assert exit.value.code == (
            f"error: --name {name!r}: Azure ML refuses it; give 1-255 letters, digits, '-', '_' or '.', starting with "
            "a letter or digit, e.g. penguins"
        )

    # A registry that refuses the version (a concurrent registration took it): one line, the files kept in the run.
    import sqlite3

    from mlflow import MlflowClient

    monkeypatch.chdir(tmp_path)  # the new run's artifacts: outputs/mlartifacts here
    MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}").search_experiments()  # MLflow's own migrations make it
    with sqlite3.connect(tmp_path / "mlflow.db") as db:
        db.execute("CREATE TRIGGER taken BEFORE INSERT ON model_versions BEGIN SELECT RAISE(ABORT, "
                   "'UNIQUE constraint failed: model_versions.name, model_versions.version'); END")  # fmt: skip
    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    with pytest.raises(SystemExit) as exit:
        register([str(tmp_path / "model"), str(tmp_path), "--name", "m", "--threshold", "0.5"])
    line = exit.value.code
    assert line.startswith("error: --name m: the MLflow registry refused it (") and "\n" not in line
    assert f"register it later with MLFLOW_TRACKING_URI={store} python -c " in line
    run_id = line.split("runs:/")[1].split("/")[0]
    assert [artifact.path for artifact in MlflowClient(store).list_artifacts(run_id, "model")] == ["model/MLmodel"]


def test_main_prints_one_line_for_an_unknown_option(capsys):
    with pytest.raises(SystemExit) as exit:
        main(["configs/penguins.yaml", "--computer", "c"])
    assert "--computer" in str(exit.value.code) and "python -m scripts.pipeline --help" in str(exit.value.code)


def test_an_experiment_name_is_azure_mls_kind_only_for_azure_ml(monkeypatch):
    """A pipeline run here (--local true, no compute) tracks to MLflow, whose experiment names take any character."""
    from scripts.azure_ml.errors import SubmitError
    from scripts.azure_ml.pipelines import plan_pipeline

    monkeypatch.chdir(REPO)
    plan = plan_pipeline(["configs/penguins.yaml"], "", score_data=str(PENGUINS), experiment="penguins lr")
    assert plan.experiment == "penguins lr"
    with pytest.raises(SubmitError, match="--experiment 'penguins lr': Azure ML takes 1-256 letters"):
        plan_pipeline(["configs/penguins.yaml"], "cpu-cluster", score_data=str(PENGUINS), experiment="penguins lr")


# ---- the table task's MLTable (datamodules/table.py reads a folder holding an MLTable file) ------------------------


@pytest.fixture(scope="module")
def penguin_mltable(tmp_path_factory) -> Path:
    """An MLTable folder (as scripts.assets registers one) of a labelled table: two measurements and a colour."""
    import numpy as np

    from scripts.azure_ml.assets import write_mltable

    rng = np.random.default_rng(0)
    folder = tmp_path_factory.mktemp("asset")
    lines = ["length,weight,colour,species"]
    for i in range(90):
        species = ("Adelie", "Chinstrap", "Gentoo")[i % 3]
        lines.append(
            f"{40 + 5 * (i % 3) + rng.normal():.1f},{rng.normal(50, 5):.1f},{('red', 'blue')[i % 2]},{species}"
        )
    (folder / "penguins.csv").write_text("\n".join(lines) + "\n")
    return write_mltable(folder / "penguins.csv", folder / "penguins-table")


TABLE = ["configs/table.yaml", "--train_args", "--data.init_args.label species"]


def table_job(tmp_path, *args: str):
    """The table task's pipeline YAML of `args`, read back with load_job from another folder."""
    from azure.ai.ml import load_job

    target = tmp_path / "jobs" / "table.yml"
    result = run_module("scripts.pipeline", *TABLE, "--compute", "cpu", *args, "--dry_run", "true",
                        "--yaml_file", target)  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    return load_job(target)


def test_a_table_pipeline_takes_an_mltable_folder_as_its_data_and_test_data(tmp_path, penguin_mltable):
    job = table_job(tmp_path, "--data", str(penguin_mltable), "--score_data", str(PENGUINS))
    train, evaluate, score = (job.jobs[name] for name in ("train", "evaluate", "score"))
    assert (train.inputs["training_data"]._data.type, train.inputs["training_data"]._data.path) == (
        "mltable",
        str(penguin_mltable),
    )
    assert train.component.inputs["training_data"].type == "mltable"
    assert evaluate.inputs["test_data"]._data.type == evaluate.component.inputs["test_data"].type == "mltable"
    assert (score.inputs["data"]._data.type, score.inputs["data"]._data.path) == ("uri_file", str(PENGUINS))
    assert "--data.init_args.csv_path ${{inputs.training_data}}" in train.component.command


def test_a_table_pipeline_takes_a_registered_mltable_asset_given_as_one(tmp_path):
    job = table_job(tmp_path, "--data", "azureml:penguins-table:3,type=mltable", "--score_data",
                    "azureml:penguins:3")  # fmt: skip
    data = job.jobs["train"].inputs["training_data"]._data
    assert data.type == "mltable" and data.path.endswith("penguins-table:3")  # load_job drops `azureml:`
    assert job.jobs["train"].component.inputs["training_data"].type == "mltable"
    assert job.jobs["score"].inputs["data"]._data.type == "uri_file"  # the CSV asset


@pytest.mark.parametrize(
    ("args", "line"),
    [
        (["configs/penguins.yaml", "--data", "azureml:penguins-table:3,type=mltable"],
         "--data azureml:penguins-table:3,type=mltable: this task reads no MLTable; give a file, as the task reads"),
        ([*TABLE, "--data", "MLTABLE"], "--data is an MLTable, which the score step (scripts.score) does not read; "
         "give --score_data a CSV of rows (a local file, or a uri_file asset azureml:NAME:VERSION)"),
        ([*TABLE, "--data", str(PENGUINS), "--score_data", "MLTABLE"], "--score_data is an MLTable, which the score"),
        ([*TABLE, "--data", "configs,type=mltable"], "--data configs,type=mltable: not a folder holding an MLTable"),
    ],
)  # fmt: skip
def test_an_mltable_a_pipeline_cannot_use_is_one_line(args, line, penguin_mltable):
    args = [str(penguin_mltable) if arg == "MLTABLE" else arg for arg in args]
    result = run_module("scripts.pipeline", *args, "--compute", "cpu", "--dry_run", "true")
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines()[-1].startswith(f"error: {line}"), result.stderr[-2000:]


@pytest.mark.parametrize(
    ("args", "line", "fixes"),
    [
        (["--data", str(PENGUINS)], "data.init_args.label", '--train_args "--data.init_args.label VALUE"'),
        (["--score_data", str(PENGUINS)], "data.init_args.csv_path and data.init_args.label",
         '--data PATH and --train_args "--data.init_args.label VALUE"'),
    ],
)  # fmt: skip
def test_a_table_pipeline_without_its_data_or_label_is_one_line_naming_the_options(args, line, fixes):
    """Its dry run printed a pipeline whose train step would fail on Azure, at the datamodule's check of its
    arguments, and ended 0."""
    result = run_module("scripts.pipeline", "configs/table.yaml", *args, "--compute", "cpu", "--dry_run", "true")
    assert (result.returncode, result.stdout) == (1, ""), result.stderr[-2000:]
    (error,) = result.stderr.strip().splitlines()
    assert error.startswith(f"error: configs/table.yaml leaves {line} unset, and the job's fit would stop at its "
                            "start: the table task needs data.init_args.csv_path")  # fmt: skip
    assert error.endswith(f"; give {fixes}")


@pytest.mark.slow
def test_a_table_pipeline_runs_here_end_to_end_on_an_mltable(tmp_path, penguin_mltable):
    result = run_module("scripts.pipeline", "configs/table.yaml", "--local", "true", "--local_dir", tmp_path,
                        "--data", penguin_mltable, "--score_data", penguin_mltable / "penguins.csv", "--threshold", "0",
                        "--train_args", "--data.init_args.label species --trainer.max_epochs 3")  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    folder = run_folder(result.stdout)
    assert f"--data.init_args.csv_path {penguin_mltable}" in result.stdout  # the folder, read as an MLTable
    rows = list(csv.reader((folder / "score/predictions/predictions.csv").read_text().splitlines()))
    assert rows[0] == ["input", "class", "probability"]
    assert len(rows) == 91 and {row[1] for row in rows[1:]} <= {"Adelie", "Chinstrap", "Gentoo"}


@pytest.mark.slow
def test_a_table_pipeline_takes_a_folder_of_parquet_files_as_a_uri_folder(tmp_path):
    """A Spark-written Parquet folder (datamodules/table_sources.py) is the train and evaluate steps' uri_folder; the
    score step, which reads a CSV of rows, is given its own."""
    import pandas as pd

    folder = tmp_path / "lake"
    folder.mkdir()
    pd.read_csv(PENGUINS).to_parquet(folder / "part-00000.snappy.parquet")
    (folder / "_SUCCESS").write_text("")
    job = table_job(tmp_path, "--data", str(folder), "--score_data", str(PENGUINS))
    train, evaluate = job.jobs["train"], job.jobs["evaluate"]
    assert (train.inputs["training_data"]._data.type, train.inputs["training_data"]._data.path) == (
        "uri_folder", str(folder))  # fmt: skip
    assert train.component.inputs["training_data"].type == evaluate.component.inputs["test_data"].type == "uri_folder"
    result = run_module("scripts.pipeline", *TABLE, "--data", str(folder), "--compute", "cpu", "--dry_run", "true")
    assert result.returncode == 1
    assert result.stderr.strip().splitlines()[-1].startswith("error: --data is a folder, which the score step")


def test_a_pattern_as_a_table_pipeline_s_data_is_one_line_naming_its_folder(tmp_path):
    """The steps' commands take an input's path whole: a pattern of part files is refused, its folder named."""
    import pandas as pd

    folder = tmp_path / "lake"
    folder.mkdir()
    pd.read_csv(PENGUINS).to_parquet(folder / "part-00000.snappy.parquet")
    given = f"{folder}/part-*.parquet"
    result = run_module("scripts.pipeline", *TABLE, "--compute", "cpu", "--data", given, "--dry_run", "true")
    assert (result.returncode, result.stderr) == (1, (
        f"error: --data {given}: a pipeline's data is a file or a folder, not a pattern; give the folder: "
        f"--data {folder},type=uri_folder (the task reads the files in it)\n"
    ))  # fmt: skip
