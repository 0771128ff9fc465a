"""A bad sweep file is one line and exit status 1 before any trial starts: the file's own mistakes without any
import of torch or Optuna, the options and their values asked of the training CLI, the objective of a short fit."""

from __future__ import annotations

import subprocess
import sys

import pytest
import yaml

from scripts.sweep import main
from scripts.sweeps.space import SweepError, load_sweep
from tests.conftest import REPO, run_module

LR = "model.optimizer.init_args.lr"
GOOD = {
    "config": "configs/penguins.yaml",
    "objective": {"metric": "val_loss", "goal": "minimize"},
    "budget": {"trials": 2},
    "search_space": {LR: {"loguniform": [1.0e-4, 1.0e-1]}},
}


@pytest.fixture(autouse=True)
def at_repo_root(monkeypatch):
    monkeypatch.chdir(REPO)  # config paths in sweep files are relative to it


def write(folder, data, name="bad.yaml"):
    path = folder / name
    path.write_text(data if isinstance(data, str) else yaml.safe_dump(data, sort_keys=False))
    return path


def changed(**sections):
    data = {key: value for key, value in GOOD.items() if sections.get(key, "") is not None}
    return data | {key: value for key, value in sections.items() if value is not None}


@pytest.mark.parametrize(
    ("data", "line"),
    [
        (changed(objective=None), "objective is missing; give objective: {metric: val_acc, goal: maximize}"),
        (changed(objective={"metric": "val_acc", "goal": "max"}), "objective.goal: 'max'; give maximize or minimize"),
        (changed(objective={"goal": "maximize"}), "objective.metric: missing; give the epoch metric to optimise"),
        (
            changed(objective={"metric": "val_acc", "goal": "minimize"}),  # else the worst trial's values in best.yaml
            "objective.goal: minimize of val_acc, an accuracy, picks the worst trial as the best; give maximize",
        ),
        (
            changed(objective={"metric": "val_loss", "goal": "maximize"}),
            "objective.goal: maximize of val_loss, a loss, picks the worst trial as the best; give minimize",
        ),
        (changed(search_space=None), "search_space is missing; give search_space: {model.optimizer.init_args.lr:"),
        (changed(search_spaces={}), "unknown key 'search_spaces'; the keys are config, objective, sampling,"),
        (changed(config="configs/nope.yaml"), "config: 'configs/nope.yaml' is not a config file here"),
        (changed(budget={}), "budget: give trials, time, or both"),
        (changed(budget={"trials": 0}), "budget.trials: 0; give a whole number of trials, 1 or more"),
        (changed(budget={"trials": 2, "time": "ten minutes"}), "budget.time: 'ten minutes'; give seconds or a"),
        (changed(search_space={LR: {"logunifrom": [0.1, 1]}}), f"search_space.{LR}: unknown distribution 'logunifrom'"),
        (changed(search_space={LR: {"loguniform": [0, 1]}}), f"search_space.{LR}: loguniform needs low above 0"),
        (changed(search_space={LR: {"uniform": [0.1, 0.01]}}), f"search_space.{LR}: uniform: low 0.1 must be below"),
        (changed(search_space={LR: {"uniform": [0.1]}}), f"search_space.{LR}: uniform takes [low, high]; got [0.1]"),
        (changed(search_space={LR: {"choice": []}}), f"search_space.{LR}: choice needs a list of values"),
        (changed(search_space={LR: [0.1, 0.2]}), f"search_space.{LR}: give one distribution (choice, uniform,"),
        (changed(search_space={LR: {"quniform": [0.05, 0.5, 0.2]}}), f"search_space.{LR}: quniform: low 0.05 and"),
        (
            changed(search_space={"data.init_args.batch_size": {"int": [8, 64.0]}}),
            "search_space.data.init_args.batch_size: int takes whole numbers",
        ),
        (
            changed(search_space={"seed_everything": {"int": [1, 9]}}),
            "search_space.seed_everything: the sweep sets it itself: each trial's seed is the sweep's seed plus",
        ),
        (
            changed(search_space={"data.init_args.seed": {"choice": [1, 2]}}),
            "search_space.data.init_args.seed: the sweep sets it itself: the split must be the same for every trial",
        ),
        (
            changed(sampling={"algorithm": "grid"}),
            f"search_space.{LR}: grid sampling needs choice or int, not loguniform",
        ),
        (changed(sampling={"algorithm": "tpe"}), "sampling.algorithm: 'tpe'; give one of random, grid, bayesian"),
        (
            changed(early_termination={"policy": "bandit"}),
            "early_termination: bandit needs one of slack_factor (a ratio, e.g. 0.1) or slack_amount",
        ),
        (changed(early_termination={"policy": "asha"}), "early_termination: policy 'asha'; give median, bandit or"),
        ("objective: [unclosed\n", "bad.yaml, line 2, column 1: not valid YAML"),
    ],
)  # fmt: skip
def test_a_mistake_in_the_file_is_one_line(tmp_path, data, line):
    path = write(tmp_path, data)
    with pytest.raises(SystemExit) as exit:
        main([str(path), "--outputs", str(tmp_path / "outputs")])
    assert str(exit.value.code).startswith(f"error: {path}"), exit.value.code
    assert line in str(exit.value.code), exit.value.code
    assert "\n" not in str(exit.value.code)
    assert not (tmp_path / "outputs").exists()  # nothing started, nothing written


@pytest.mark.parametrize(
    ("space", "line"),
    [
        (
            {"model.optimizer.init_args.lrr": {"uniform": [0.01, 0.1]}},
            "search_space.model.optimizer.init_args.lrr: no such option in configs/penguins.yaml (python -m "
            "scripts.train fit --config configs/penguins.yaml --print_config lists them)",
        ),
        (
            {"model.optimizer.lr": {"uniform": [0.01, 0.1]}},  # the CLI's shorthand: not a name a config file takes
            "search_space.model.optimizer.lr: no such option in configs/penguins.yaml; did you mean "
            "model.optimizer.init_args.lr?",
        ),
        (
            {"data.init_args.batch_size": {"uniform": [10, 40]}},
            "search_space.data.init_args.batch_size = 10.0: data.init_args.batch_size: '10.0' is not a valid value; "
            "give int",
        ),
        (
            {"data.init_args.batch_size": {"choice": [10, "10", 20]}},  # mixed types: one value for the CLI
            "search_space.data.init_args.batch_size: choice 10 and '10' are one value for the CLI (10); give each once",
        ),
        (
            {"data.init_args.preprocessing": {"choice": ["course", "zscore"]}},
            "search_space.data.init_args.preprocessing = zscore: data.init_args.preprocessing: 'zscore' is not a "
            "valid value",
        ),
    ],
)
def test_an_option_the_cli_does_not_have_or_a_value_it_refuses_is_one_line(tmp_path, space, line):
    path = write(tmp_path, changed(search_space=space))
    with pytest.raises(SystemExit) as exit:
        main([str(path), "--outputs", str(tmp_path / "outputs")])
    assert str(exit.value.code) == f"error: {path}: {line}" or str(exit.value.code).startswith(
        f"error: {path}: {line}"
    ), exit.value.code
    assert not (tmp_path / "outputs").exists()


NEVER = "the trials would never validate, so none would log val_loss"


@pytest.mark.parametrize(
    ("fixed", "space", "line"),
    [
        (
            {"trainer.limit_val_batches": 0},
            {},
            f"fixed.trainer.limit_val_batches 0.0: {NEVER}; give it above 0 (or leave it out)",
        ),
        (
            {"trainer.max_epochs": 4, "trainer.check_val_every_n_epoch": 5},
            {},
            f"fixed.trainer.check_val_every_n_epoch 5 with fixed.trainer.max_epochs 4: {NEVER}; give "
            "check_val_every_n_epoch 4 or less",
        ),
        (
            {"trainer.check_val_every_n_epoch": 150},  # above the config's own 100 epochs
            {},
            "fixed.trainer.check_val_every_n_epoch 150 with trainer.max_epochs 100 (in configs/penguins.yaml): "
            f"{NEVER}; give check_val_every_n_epoch 100 or less",
        ),
        (
            {"trainer.check_val_every_n_epoch": 3},
            {"trainer.max_epochs": {"int": [2, 6]}},  # its low end never validates
            f"fixed.trainer.check_val_every_n_epoch 3 with search_space.trainer.max_epochs 2: {NEVER}; give "
            "check_val_every_n_epoch 2 or less",
        ),
    ],
)
def test_trials_that_would_never_validate_are_one_line_before_any_trial(tmp_path, fixed, space, line):
    # Else the objective check (whose one epoch validates) passed and every trial failed, 'logged no val_loss'.
    path = write(tmp_path, changed(fixed=fixed, search_space={**GOOD["search_space"], **space}))
    with pytest.raises(SystemExit) as exit:
        main([str(path), "--outputs", str(tmp_path / "outputs")])
    assert exit.value.code == f"error: {path}: {line}"
    assert not (tmp_path / "outputs").exists()


def test_trials_that_validate_every_few_epochs_are_not_refused(tmp_path):
    from scripts.sweeps.preflight import check_options

    fixed = {"trainer.max_epochs": 10, "trainer.check_val_every_n_epoch": 2, "trainer.limit_val_batches": 0.5}
    check_options(load_sweep(str(write(tmp_path, changed(fixed=fixed)))))


@pytest.mark.slow
def test_an_objective_the_module_does_not_log_is_one_line_before_any_trial(tmp_path):
    path = write(tmp_path, changed(objective={"metric": "val_accuracy", "goal": "maximize"}))
    outputs = tmp_path / "outputs"
    result = run_module("scripts.sweep", str(path), "--outputs", str(outputs), timeout=300)
    assert result.returncode == 1
    assert result.stderr.splitlines() == [
        f"error: {path}: objective.metric val_accuracy is not a metric the fit logs by each validation's end; give "
        "one of val_acc, val_loss"
    ]
    assert not (outputs / "sweeps").exists() and not (outputs / "mlflow.db").exists()  # no study, no run


def test_the_objective_check_validates_though_the_trials_validate_every_few_epochs(tmp_path):
    from scripts.sweeps.preflight import check_metric

    # Trials of 4 epochs validate at epochs 1 and 3; the check's one epoch must validate all the same.
    fixed = {"trainer.max_epochs": 4, "trainer.check_val_every_n_epoch": 2}
    check_metric(load_sweep(str(write(tmp_path, changed(fixed=fixed)))), tmp_path)


@pytest.mark.slow
def test_the_objective_check_takes_the_batches_an_integer_val_check_interval_needs(tmp_path):
    from scripts.sweeps.preflight import check_metric, check_options

    # A penguin epoch has 12 batches of 20: validating every 3 is a valid sweep (refused as 'above 2 batches' before).
    sweep = load_sweep(str(write(tmp_path, changed(fixed={"trainer.val_check_interval": 3}))))
    check_metric(sweep, tmp_path, check_options(sweep))
    # Every 100 batches is above an epoch's: refused by the epoch's real batches, not the check's.
    sweep = load_sweep(str(write(tmp_path, changed(fixed={"trainer.val_check_interval": 100}))))
    with pytest.raises(SweepError, match=r"val_check_interval` \(100\) must be .* training batches \(12\)"):
        check_metric(sweep, tmp_path, check_options(sweep))


@pytest.mark.parametrize("name", ["{user}", "../mine", "penguins/v2", ".."])
def test_a_study_name_that_is_a_path_is_one_line_and_nothing_of_the_users_is_replaced(tmp_path, name):
    # The study's folder, outputs/sweeps/NAME, has its trial-N folders and best.yaml replaced by the study's.
    user = tmp_path / "mine"
    (user / "trial-0").mkdir(parents=True)
    (user / "trial-0" / "notes.txt").write_text("mine")
    (user / "best.yaml").write_text("mine")
    outputs = tmp_path / "outputs"
    (outputs / "sweeps").mkdir(parents=True)  # a sweep ran here before
    name = name.format(user=user)
    with pytest.raises(SystemExit) as exit:
        main([str(write(tmp_path, GOOD)), "--study_name", name, "--outputs", str(outputs)])
    assert exit.value.code == (
        f"error: --study_name {name}: a name, not a path (the study's folder is {outputs}/sweeps/NAME); give one "
        "such as penguins-2"
    )
    assert sorted(str(path.relative_to(tmp_path)) for path in tmp_path.rglob("*")) == [
        "bad.yaml", "mine", "mine/best.yaml", "mine/trial-0", "mine/trial-0/notes.txt", "outputs", "outputs/sweeps"
    ]  # fmt: skip


@pytest.mark.parametrize("outputs", ["notes.txt", "notes.txt/outputs"])
def test_outputs_under_a_file_is_one_line_and_the_file_stays(tmp_path, outputs):
    notes = tmp_path / "notes.txt"
    notes.write_text("mine")
    with pytest.raises(SystemExit) as exit:
        main([str(write(tmp_path, GOOD)), "--outputs", str(tmp_path / outputs)])
    assert exit.value.code == f"error: --outputs {tmp_path / outputs}: {notes} is a file, not a folder; give a folder"
    assert notes.read_text() == "mine"


def test_a_storage_that_cannot_be_opened_is_one_line_before_the_other_checks(tmp_path):
    path = write(tmp_path, GOOD)
    with pytest.raises(SystemExit) as exit:
        main([str(path), "--storage", "postgresql://sweeper@127.0.0.1:1/studies", "--outputs", str(tmp_path / "o")])
    assert str(exit.value.code).startswith(
        "error: --storage postgresql://sweeper@127.0.0.1:1/studies: cannot open the study's database ("
    ), exit.value.code
    assert "\n" not in str(exit.value.code)


@pytest.mark.slow  # seconds of a worker: make test-fast stays under 2 minutes
def test_a_study_started_from_another_search_space_is_refused_not_mixed(tmp_path):
    import json

    import optuna

    path = write(tmp_path, GOOD, name="penguins-study.yaml")
    outputs = tmp_path / "outputs"
    (outputs / "sweeps").mkdir(parents=True)
    other = changed(search_space={LR: {"loguniform": [1.0e-3, 1.0e-1]}})
    study = optuna.create_study(study_name="penguins-study", storage=f"sqlite:///{outputs}/sweeps/optuna.db")
    study.set_user_attr("sweep_file", json.dumps(load_sweep(str(write(tmp_path, other))).fingerprint(), sort_keys=True))
    with pytest.raises(SystemExit) as exit:
        main([str(path), "--outputs", str(outputs)])
    assert exit.value.code == (
        f"error: {path}: study penguins-study in sqlite:///{outputs}/sweeps/optuna.db was started with another config, "
        "objective or search space; give --study_name NEW for a new study (or delete that study to start over)"
    )
    assert len(study.trials) == 0  # no trial ran


@pytest.mark.slow
def test_a_study_resumed_after_its_config_file_was_edited_is_refused_naming_the_file(tmp_path):
    import json
    import shutil

    import optuna

    from scripts.sweeps.study import connect, open_study

    config = tmp_path / "penguins.yaml"
    shutil.copy(REPO / "configs/penguins.yaml", config)
    path = write(tmp_path, changed(config=str(config)), name="penguins-study.yaml")
    outputs = tmp_path / "outputs"
    (outputs / "sweeps" / "penguins-study").mkdir(parents=True)
    url = f"sqlite:///{outputs}/sweeps/optuna.db"
    study = optuna.create_study(study_name="penguins-study", storage=url)
    study.set_user_attr("sweep_file", json.dumps(load_sweep(str(path)).fingerprint(), sort_keys=True))
    open_study(load_sweep(str(path)), "penguins-study", connect(url), outputs / "sweeps" / "penguins-study")  # resumes
    # Its trials trained on a batch of 20: the next would on 40, best.yaml would say 40 of the best's 20.
    config.write_text(config.read_text().replace("batch_size: 20", "batch_size: 40"))
    with pytest.raises(SystemExit) as exit:
        main([str(path), "--outputs", str(outputs)])
    assert exit.value.code == (
        f"error: {path}: {config} changed since study penguins-study in {url} started (its trials trained on it as it "
        "was); restore it, or give --study_name NEW for a new study"
    )
    assert len(study.trials) == 0  # no trial ran


@pytest.mark.slow  # seconds of a worker: make test-fast stays under 2 minutes
def test_a_study_resumed_after_a_config_file_its_config_points_to_was_edited_is_refused_naming_it(tmp_path):
    import json

    import optuna

    from scripts.sweeps.study import connect, open_study

    # jsonargparse reads data: data.yaml as that file (relative to the config's folder): part of the config.
    head = (REPO / "configs/penguins.yaml").read_text().split("\ndata:\n")[0]
    (tmp_path / "configs").mkdir()
    config = tmp_path / "configs" / "penguins.yaml"
    config.write_text(head + "\ndata: data/penguins.yaml\n")
    nested = tmp_path / "configs" / "data" / "penguins.yaml"
    nested.parent.mkdir()
    nested.write_text("class_path: datamodules.penguins.PenguinDataModule\ninit_args:\n  batch_size: 20\n  seed: 42\n")
    path = write(tmp_path, changed(config=str(config)), name="penguins-study.yaml")
    outputs = tmp_path / "outputs"
    (outputs / "sweeps" / "penguins-study").mkdir(parents=True)
    url = f"sqlite:///{outputs}/sweeps/optuna.db"
    study = optuna.create_study(study_name="penguins-study", storage=url)
    study.set_user_attr("sweep_file", json.dumps(load_sweep(str(path)).fingerprint(), sort_keys=True))
    open_study(load_sweep(str(path)), "penguins-study", connect(url), outputs / "sweeps" / "penguins-study")  # resumes
    nested.write_text(nested.read_text().replace("batch_size: 20", "batch_size: 40"))
    with pytest.raises(SystemExit) as exit:
        main([str(path), "--outputs", str(outputs)])
    assert exit.value.code == (
        f"error: {path}: {nested} changed since study penguins-study in {url} started (its trials trained on it as it "
        "was); restore it, or give --study_name NEW for a new study"
    )
    assert len(study.trials) == 0  # no trial ran


def test_the_config_files_a_sweep_points_to_are_those_jsonargparse_reads(tmp_path, monkeypatch):
    from scripts.sweeps.space import nested_configs

    monkeypatch.chdir(tmp_path)
    files = {
        "configs/task.yaml": "config: base.yaml\nmodel:\n  network: nets/net.yaml\ndata:\n  init_args:\n"
        "    csv_path: data/penguins.csv\n    predict_path: configs/new.yaml\n",  # relative to configs/: none
        "configs/base.yaml": "trainer: trainer/cpu.yaml\n",
        "configs/nets/net.yaml": "class_path: x.Net\n",
        "configs/trainer/cpu.yaml": "callbacks:\n  - ../base.yaml\n  - ../task.yaml\n",  # met before: once
        "configs/new.yaml": "max_epochs: 3\n",
        "nets/other.yaml": "class_path: x.Other\n",
        "data/penguins.csv": "a,b\n",
    }
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    # An option's value is relative to the working folder, as the CLI reads --model.network nets/other.yaml.
    found = nested_configs(["configs/task.yaml"], [{"x": "nets/other.yaml"}, ("configs/missing.yaml", 3)])
    assert found == ["configs/base.yaml", "configs/trainer/cpu.yaml", "configs/nets/net.yaml", "nets/other.yaml"]


def test_a_study_started_before_configs_were_fingerprinted_by_contents_resumes(tmp_path):
    import json

    import optuna

    from scripts.sweeps.study import connect, open_study

    path = write(tmp_path, GOOD, name="penguins-study.yaml")
    folder, url = tmp_path / "penguins-study", f"sqlite:///{tmp_path}/optuna.db"
    folder.mkdir()
    study = optuna.create_study(study_name="penguins-study", storage=url)
    old = {key: value for key, value in load_sweep(str(path)).fingerprint().items() if key != "contents"}
    study.set_user_attr("sweep_file", json.dumps(old, sort_keys=True))
    open_study(load_sweep(str(path)), "penguins-study", connect(url), folder)
    stored = optuna.load_study(study_name="penguins-study", storage=url).user_attrs["sweep_file"]
    assert "contents" in json.loads(stored)  # and from now on checked


@pytest.mark.slow
def test_sweep_processes_opening_one_new_sqlite_study_at_the_same_moment_all_open_it(tmp_path):
    """Two sweep processes started together on a new study (its README use): Optuna creates the tables unguarded, so
    all but one would fail with "table studies already exists" unless each opened it again until the tables are
    there. Threads of one process race as processes do (each its own engine and connection)."""
    import threading

    from scripts.sweeps.study import connect

    def open_it(url: str, together: threading.Barrier, failed: list[str]) -> None:
        together.wait()
        try:
            connect(url)
        except SweepError as error:
            failed.append(str(error))

    for attempt in range(3):
        together, failed = threading.Barrier(4), []
        args = (f"sqlite:///{tmp_path}/optuna-{attempt}.db", together, failed)
        threads = [threading.Thread(target=open_it, args=args) for _ in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert failed == []


def test_a_sweep_opens_a_new_sqlite_study_that_another_program_creates_at_the_same_moment(tmp_path):
    """Another program that opens the database (optuna-dashboard, optuna.load_study in a notebook
    or a test watching the sweep) while a sweep starts creates the same tables unguarded; the sweep waits for it and
    opens the study, whether or not that program survives the race."""
    import threading

    import optuna

    from scripts.sweeps.study import connect

    def open_it(url: str, together: threading.Barrier, failed: list[str], sweep: bool) -> None:
        together.wait()
        try:
            connect(url) if sweep else optuna.storages.RDBStorage(url)
        except SweepError as error:
            failed.append(str(error))
        except Exception:  # the other program's own race, not the sweep's
            pass

    for attempt in range(4):
        together, failed = threading.Barrier(4), []
        url = f"sqlite:///{tmp_path}/optuna-{attempt}.db"
        threads = [threading.Thread(target=open_it, args=(url, together, failed, i == 0)) for i in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert failed == []


HEAVY = ("torch", "lightning", "mlflow", "optuna", "sqlalchemy")


@pytest.mark.parametrize(
    ("args", "status", "said"),
    [
        (["--help"], 0, "sweep_file"),
        (["BAD"], 1, "bad.yaml, line 2, column 1: not valid YAML"),
        (["BAD", "--n_jobs", "0"], 1, "bad.yaml, line 2, column 1: not valid YAML"),
        (["configs/sweeps/nope.yaml"], 1, "configs/sweeps/nope.yaml: no such sweep file"),
    ],
)
def test_help_and_a_mistake_in_the_file_answer_before_torch_lightning_mlflow_or_optuna_is_imported(
    tmp_path, args, status, said
):
    # A fresh interpreter (not the tests' warm launcher, which has them imported): -X importtime lists its imports.
    bad = write(tmp_path, "objective: [unclosed\n")
    command = [
        sys.executable,
        "-X",
        "importtime",
        "-m",
        "scripts.sweep",
        *[str(bad) if a == "BAD" else a for a in args],
    ]
    result = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert result.returncode == status, result.stderr[-2000:]
    messages = [text for text in result.stderr.splitlines() if not text.startswith("import time:")]
    assert said in result.stdout + "\n".join(messages)
    imported = [text.rsplit("|", 1)[-1].strip() for text in result.stderr.splitlines() if text.startswith("import")]
    assert not [name for name in imported if name.split(".")[0] in HEAVY]
