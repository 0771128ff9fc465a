"""A sweep measured against the config it searches around, in one run on this machine:

    python -m scripts.bench.sweep [--sweep configs/sweeps/penguins.yaml]

1. the task's default config, trained once as `make train` does (the reference: its wall time, and the validation
   accuracy and loss at the epoch of its best checkpoint, the lowest val_loss);
2. the sweep file's local sweep (`python -m scripts.sweep`): wall time and that time in default fits, trials
   completed / pruned / failed, epochs trained, the best trial's validation accuracy and loss at its best epoch;
3. the best trial's config (best.yaml) trained again on top of the default one, and both test accuracies.
Everything runs in a temporary outputs folder (MLflow store and study included); nothing of ./outputs is touched.
Each of the three commands' wall time is printed when it ends (`default config, one fit: 21.7 s`), the rest after
the last; a command that fails ends the bench in one line naming it, with its error line.
A small sweep file (a few trials of a few epochs) makes it a quick check: tests/bench/test_bench_sweep.py.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import yaml

from scripts.bench.report import Report, run_command


def run(command: list[str]) -> tuple[float, str]:
    started = time.perf_counter()
    result = run_command(command)
    return time.perf_counter() - started, result.stdout


def took(result: tuple[float, str]) -> str:
    return f"{result[0]:.1f} s"


def at_best_epoch(client, run_id: str) -> tuple[float, float, int]:
    """(val_acc, val_loss, epochs) of a run, at its epoch of lowest val_loss (its best.ckpt)."""
    losses = {m.step: m.value for m in client.get_metric_history(run_id, "val_loss")}
    accuracies = {m.step: m.value for m in client.get_metric_history(run_id, "val_acc")}
    epoch = min(losses, key=losses.get)
    return accuracies[epoch], losses[epoch], len(losses)


def test_acc(stdout: str) -> float:
    return float(stdout.rsplit("test_acc:", 1)[1].split()[0])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sweep", default="configs/sweeps/penguins.yaml")
    args = parser.parse_args(argv)
    import optuna
    from mlflow import MlflowClient

    from scripts.sweeps.space import load_sweep

    report = Report("sweep")
    sweep = report.step(f"reading {args.sweep}", load_sweep, args.sweep)
    configs = [item for config in sweep.configs for item in ("--config", config)]
    with tempfile.TemporaryDirectory() as folder:
        outputs = Path(folder) / "outputs"
        client = MlflowClient(f"sqlite:///{outputs}/mlflow.db")
        root = ["--trainer.default_root_dir", str(outputs)]
        default_s, default_out = report.measured(
            "default config, one fit", took, run, [sys.executable, "-m", "scripts.train", "fit", *configs, *root]
        )
        (default_run,) = client.search_runs([e.experiment_id for e in client.search_experiments()])
        default = at_best_epoch(client, default_run.info.run_id)

        sweep_command = [sys.executable, "-m", "scripts.sweep", args.sweep, "--outputs", str(outputs)]
        sweep_s, sweep_out = report.measured("sweep (python -m scripts.sweep)", took, run, sweep_command)
        study = optuna.load_study(study_name=sweep.name, storage=f"sqlite:///{outputs}/sweeps/optuna.db")
        states = [trial.state.name for trial in study.trials]
        epochs = sum(len(trial.intermediate_values) for trial in study.trials)
        best = at_best_epoch(client, study.best_trial.user_attrs["mlflow_run_id"])
        best_config = outputs / "sweeps" / sweep.name / "best.yaml"
        best_command = [sys.executable, "-m", "scripts.train", "fit", *configs, "--config", str(best_config), *root]
        _, best_out = report.measured("best trial's config trained again", took, run, best_command)
        best_params = {"seed_everything": yaml.safe_load(best_config.read_text())["seed_everything"]}
        best_params |= study.best_trial.params

    policy = sweep.termination.policy
    print(f"{args.sweep}: {len(states)} trials, {sweep.algorithm} sampling, {policy} early termination")
    print(f"  default config, one fit           {default_s:7.1f} s   1.00x")
    print(f"  sweep (python -m scripts.sweep)   {sweep_s:7.1f} s  {sweep_s / default_s:5.2f}x the default fit")
    counts = ", ".join(f"{states.count(state)} {state.lower()}" for state in ("COMPLETE", "PRUNED", "FAIL"))
    print(f"  trials: {counts}; {epochs} epochs trained in all")
    pruned = [str(number) for number, state in enumerate(states) if state == "PRUNED"]
    print(f"  pruned: trials {', '.join(pruned) or 'none'}")
    print("  validation at the best epoch (lowest val_loss)    val_acc   val_loss")
    print(f"    default config                                  {default[0]:.4f}    {default[1]:.4f}")
    number = study.best_trial.number
    print(f"    best trial ({number:>2})                                 {best[0]:.4f}    {best[1]:.4f}")
    print(f"  test_acc: default {test_acc(default_out):.4f}, best config trained again {test_acc(best_out):.4f}")
    print(f"  best values: {', '.join(f'{option} {value}' for option, value in best_params.items())}")
    print(sweep_out.rsplit("best trial", 1)[0].splitlines()[-1])


if __name__ == "__main__":
    main()
