"""scripts.submit --sweep: the Azure ML sweep job of a sweep file, checked offline by the real azure-ai-ml objects:
its YAML through `load_job`, its trial command through the training CLI, and a submission through MLClient over the
fake HTTP transport of tests/azure/test_submit.py."""

from __future__ import annotations

import math
import re
import subprocess
import sys

import pytest
import yaml

from scripts.submit import main, submit
from scripts.sweeps.azure import search_space_names
from scripts.sweeps.space import load_sweep
from tests.azure.fake_azure import FakeAzureML, fake_client
from tests.conftest import REPO

PENGUINS_SWEEP = "configs/sweeps/penguins.yaml"


@pytest.fixture(autouse=True)
def at_repo_root(monkeypatch):
    monkeypatch.chdir(REPO)


def dry_run_job(tmp_path, *args, **kwargs):
    from azure.ai.ml import load_job

    text = submit(*args, dry_run=True, **kwargs)
    (tmp_path / "sweep.yml").write_text(text)
    return load_job(tmp_path / "sweep.yml"), yaml.safe_load(text)


def test_the_dry_run_yaml_is_a_sweep_job_of_the_files_space_objective_policy_and_limits(tmp_path, capsys):
    job, data = dry_run_job(tmp_path, "configs/penguins.yaml", compute="cpu-cluster", sweep=PENGUINS_SWEEP)
    assert job.type == "sweep" and data["trial"]["code"] == "."  # az ml job create -f from the repository root
    assert (job.objective.primary_metric, job.objective.goal) == ("val_loss", "minimize")  # what the trial logs
    assert (job.sampling_algorithm.type, job.sampling_algorithm.seed) == ("random", 42)
    policy = job.early_termination
    assert (policy.type, policy.delay_evaluation, policy.evaluation_interval) == ("median_stopping", 10, 5)
    limits = job.limits
    assert (limits.max_total_trials, limits.max_concurrent_trials, limits.timeout, limits.trial_timeout) == (
        20, 4, 3600, 600
    )  # fmt: skip
    space = job.search_space
    lr = space["model_optimizer_init_args_lr"]
    assert lr.type == "loguniform"  # Azure ML's bounds are logarithms: e^min..e^max is the file's range
    assert (math.exp(lr.min_value), math.exp(lr.max_value)) == (pytest.approx(1e-4), pytest.approx(1e-1))
    assert space["data_init_args_batch_size"].values == [10, 20, 40]
    assert space["model_network_init_args_hidden"].values == list(range(5, 33))  # int: exactly these integers
    assert space["model_optimizer_class_path"].values == ["torch.optim.Adam", "torch.optim.SGD"]
    sweep = load_sweep(PENGUINS_SWEEP)
    for option, name in search_space_names(sweep).items():
        assert f"--{option} ${{{{search_space.{name}}}}}" in job.trial.command
        assert job.tags[f"search_space.{name}"] == option  # the way back to the option's name
    assert job.trial.command.startswith("python -m scripts.train fit --config configs/penguins.yaml ")
    assert "--checkpoint_dir" not in job.trial.command  # trials would share the output
    assert job.experiment_name == "penguins" and job.compute == "cpu-cluster"


@pytest.mark.filterwarnings("ignore:LightningCLI's args parameter")  # pytest's own arguments are in sys.argv
def test_a_trials_command_with_its_values_is_one_the_training_cli_accepts(tmp_path, capsys):
    from scripts.train import cli_main
    from scripts.training.checkpoints import flatten

    job, _ = dry_run_job(tmp_path, "configs/penguins.yaml", compute="cpu-cluster", sweep=PENGUINS_SWEEP)
    drawn = {
        "model_optimizer_class_path": "torch.optim.SGD",
        "model_optimizer_init_args_lr": math.exp(-4.2),
        "data_init_args_batch_size": 40,
        "model_network_init_args_hidden": 17,
        "data_init_args_preprocessing": "standardize",
    }  # what Azure ML would substitute for one trial
    command = re.sub(r"\$\{\{search_space\.(\w+)\}\}", lambda m: str(drawn[m.group(1)]), job.trial.command)
    capsys.readouterr()
    with pytest.raises(SystemExit):
        cli_main(command.removeprefix("python -m scripts.train ").split() + ["--print_config"])
    printed = flatten(yaml.safe_load(capsys.readouterr().out))
    by_option = {job.tags[f"search_space.{name}"]: value for name, value in drawn.items()}  # the tags name them back
    assert by_option == {option: printed[option] for option in by_option}  # each value reached its option


def test_distributed_trials_run_ddp_with_the_jobs_processes_and_inputs(tmp_path):
    data = tmp_path / "mnist"
    data.mkdir()
    job, raw = dry_run_job(
        tmp_path, "configs/mnist.yaml", compute="gpu-cluster", presets=["configs/trainer/gpu.yaml"], nodes=2,
        processes_per_node=4, distribution="pytorch",
        inputs=[f"data.init_args.data_dir={data}"], sweep="configs/sweeps/mnist.yaml",
    )  # fmt: skip
    assert (job.trial.distribution.type, job.trial.distribution.process_count_per_instance) == ("pytorch", 4)
    assert raw["trial"]["resources"]["instance_count"] == 2
    assert "--config configs/trainer/ddp.yaml --trainer.devices 4 --trainer.num_nodes 2" in job.trial.command
    assert "--data.init_args.data_dir ${{inputs.data_dir}}" in job.trial.command
    assert (REPO / job.inputs["data_dir"].path).resolve() == data  # a local folder, relative to job.yml at the root
    policy = job.early_termination
    assert (policy.type, policy.slack_amount, policy.delay_evaluation) == ("bandit", 0.01, 2)
    dropout = job.search_space["model_network_init_args_dropout"]
    assert (dropout.type, dropout.min_value, dropout.max_value, dropout.q) == ("quniform", 0.0, 0.5, 0.05)
    assert job.search_space["model_warmup_steps"].values == [0, 100, 200, 300, 400, 500, 600]
    assert job.search_space["data_init_args_augment"].values == ["true", "false"]  # as the CLI spells them
    assert raw["trial"]["environment"]["image"].endswith("cuda11.8-cudnn8-ubuntu22.04:latest")  # the GPU image


def test_the_yaml_file_runs_from_its_own_folder(tmp_path, monkeypatch):
    from azure.ai.ml import load_job

    target = tmp_path / "jobs" / "sweep.yml"
    target.parent.mkdir()
    submit("configs/penguins.yaml", compute="cpu", dry_run=True, yaml_file=str(target), sweep=PENGUINS_SWEEP)
    monkeypatch.chdir(tmp_path)
    job = load_job(target)
    assert (target.parent / job.trial.code).resolve() == REPO


def test_a_submission_puts_the_sweep_job_over_the_fake_transport(monkeypatch, capsys):
    azure = FakeAzureML()
    client = fake_client(azure)
    monkeypatch.setattr("scripts.submit.workspace_client", lambda *ids: client)
    name = submit("configs/penguins.yaml", compute="cpu-cluster", nodes=2, processes_per_node=2, sweep=PENGUINS_SWEEP)
    assert re.fullmatch(rf"submitted {name}: \S+\n", capsys.readouterr().out)
    (sent,) = [body for method, path, body in azure.requests if method == "PUT" and path.endswith(f"/jobs/{name}")]
    job = sent["properties"]
    assert job["jobType"] == "Sweep"
    assert job["objective"] == {"goal": "minimize", "primaryMetric": "val_loss"}
    assert job["samplingAlgorithm"] == {"seed": 42, "samplingAlgorithmType": "Random"}
    assert job["earlyTermination"] == {"delayEvaluation": 10, "evaluationInterval": 5, "policyType": "MedianStopping"}
    limits = {"maxTotalTrials": 20, "maxConcurrentTrials": 4, "timeout": "PT1H", "trialTimeout": "PT10M"}
    assert {key: job["limits"][key] for key in limits} == limits
    assert job["searchSpace"]["model_optimizer_init_args_lr"] == ["loguniform", [math.log(1e-4), math.log(1e-1)]]
    assert job["searchSpace"]["data_init_args_batch_size"] == ["choice", [[10, 20, 40]]]
    assert job["trial"]["distribution"] == {"distributionType": "PyTorch", "processCountPerInstance": 2}
    assert job["resources"]["instanceCount"] == 2
    assert "${{search_space.model_optimizer_init_args_lr}}" in job["trial"]["command"]
    assert job["trial"]["codeId"].endswith("/versions/1") and job["trial"]["environmentId"]
    assert job["computeId"].endswith("/computes/cpu-cluster")


def test_trials_of_more_nodes_than_the_cluster_scales_to_are_one_line_before_anything_is_uploaded(monkeypatch):
    azure = FakeAzureML()
    client = fake_client(azure)
    monkeypatch.setattr("scripts.submit.workspace_client", lambda *ids: client)
    with pytest.raises(SystemExit) as exit:
        main(["configs/penguins.yaml", "--compute", "gpu-cluster", "--sweep", PENGUINS_SWEEP, "--nodes", "5"])
    assert exit.value.code == (
        "error: --nodes 5: the cluster gpu-cluster scales to at most 4 nodes; give 4 or fewer, or raise its maximum "
        "(az ml compute update --name gpu-cluster --max-instances 5)"
    )
    assert [method for method, *_ in azure.requests] == ["GET"] and azure.code_hashes == []


def sweep_file(tmp_path, **sections):
    data = yaml.safe_load((REPO / PENGUINS_SWEEP).read_text()) | sections
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


@pytest.mark.parametrize(
    ("sections", "line"),
    [
        (
            {"sampling": {"algorithm": "bayesian"}},
            "Azure ML's bayesian sampling takes no early termination: give sampling.algorithm random, or "
            "early_termination.policy none",
        ),
        (
            {"sampling": {"algorithm": "bayesian"}, "early_termination": {"policy": "none"}},  # the SDK sends it
            "search_space.model.optimizer.init_args.lr: Azure ML's bayesian sampling takes choice, int, uniform and "
            "quniform, not loguniform; give sampling.algorithm random, or model.optimizer.init_args.lr a uniform "
            "range or a choice of values",
        ),
        (
            {"search_space": {"trainer.max_steps": {"int": [1, 5000]}}},
            "search_space.trainer.max_steps: int [1, 5000, 1] is 5000 values, more than Azure ML's choice takes here "
            "(1000); give a step, e.g. {int: [1, 5000, 5]}",
        ),
        (
            {"search_space": {"data.init_args.preprocessing": {"choice": ["course", "standardize $HOME"]}}},
            "search_space.data.init_args.preprocessing: choice 'standardize $HOME' would not reach the trial as one "
            "value (Azure ML writes it into a shell command as it is); give values without spaces, quotes or shell "
            "characters",
        ),
        pytest.param(  # the training CLI checks the option: Lightning imported in a fresh interpreter
            {"search_space": {"model.optimiser.init_args.lr": {"uniform": [0.1, 1]}}},
            "no such option",
            marks=pytest.mark.slow,
        ),
        ({"objective": None}, "objective is missing"),
        (
            {"config": "configs/mnist.yaml"},  # the job is penguins': a sweep file of another task
            "config configs/mnist.yaml is not the job's task, configs/penguins.yaml (its trials would train that); "
            "give the job configs/mnist.yaml, or a sweep file of configs/penguins.yaml",
        ),
        (
            {"config": ["configs/penguins.yaml", "configs/trainer/gpu.yaml"]},
            "config configs/trainer/gpu.yaml is not among the job's; add --presets+ configs/trainer/gpu.yaml",
        ),
    ],
)
def test_a_bad_sweep_file_is_one_line_before_the_azure_sdk_is_imported(tmp_path, sections, line):
    path = sweep_file(tmp_path, **sections)
    command = ["-X", "importtime", "-m", "scripts.submit", "configs/penguins.yaml", "--compute", "c", "--sweep", path]
    result = subprocess.run([sys.executable, *map(str, command)], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert result.returncode == 1
    messages = [text for text in result.stderr.splitlines() if not text.startswith("import time:")]
    assert len(messages) == 1 and messages[0].startswith(f"error: --sweep {path}: "), messages
    assert line in messages[0], messages
    imported = [text.rsplit("|", 1)[-1].strip() for text in result.stderr.splitlines() if text.startswith("import")]
    assert not [name for name in imported if name.startswith("azure")]


def test_a_search_space_option_the_job_already_sets_is_refused(tmp_path):
    path = sweep_file(tmp_path, search_space={"trainer.devices": {"choice": [1, 2]}})
    with pytest.raises(SystemExit) as exit:
        main(["configs/penguins.yaml", "--compute", "c", "--sweep", str(path), "--dry_run", "true"])
    assert exit.value.code == (
        f"error: --sweep {path}: search_space.trainer.devices: the job's processes decide it; give submit's "
        "--processes_per_node"
    )


def test_trials_take_the_tier_the_shared_memory_and_a_registered_environment(tmp_path, capsys):
    job, raw = dry_run_job(
        tmp_path, "configs/birds.yaml", compute="gpu-cluster", sweep="configs/sweeps/birds.yaml", tier="spot",
        environment="azureml:lightning-training-gpu:1",
    )  # fmt: skip
    assert job.queue_settings.job_tier == "spot"
    assert raw["trial"]["resources"]["shm_size"] == "2g"  # birds' 2 DataLoader workers
    assert raw["trial"]["environment"] == "azureml:lightning-training-gpu:1"
    with pytest.raises(SystemExit) as exit:
        main(["configs/penguins.yaml", "--compute", "c", "--sweep", PENGUINS_SWEEP, "--timeout", "4h"])
    assert exit.value.code == (
        "error: --timeout with --sweep: a sweep's limits are its file's budget.time and budget.trial_time"
    )
