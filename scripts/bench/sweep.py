"""A sweep measured against the config it searches around, in one run on this machine:

    python -m scripts.bench.sweep [--sweep configs/sweeps/penguins.yaml] [--minute_epochs N]

1. the task's default config, trained once as `make train` does (the reference: its wall time, and the validation
   accuracy and loss at the epoch of its best checkpoint, the lowest val_loss);
2. the sweep file's local sweep (`python -m scripts.sweep`): wall time and that time in default fits, trials
   completed / pruned / failed, epochs trained, the best trial's validation accuracy and loss at its best epoch, and
   a trial's start-up (below) against its whole time, medians over the trials;
3. the best trial's config (best.yaml) trained again on top of the default one, and both test accuracies;
4. the sweep's first trial again (the same values), made to last about a minute: as many epochs as its time an epoch
   in 2. gives (or `--minute_epochs`), early stopping held off by min_epochs; its start-up, its whole time, and the
   share of the one in the other.
Everything runs in a temporary outputs folder (MLflow store and study included); nothing of ./outputs is touched.
Each command's wall time is printed when it ends (`default config, one fit: 21.7 s`), the rest after the last; a
command that fails ends the bench in one line naming it, with its error line. A small sweep file (a few trials of a
few epochs) makes it a quick check: tests/bench/test_bench_sweep.py.

A trial's start-up is the time from its process's start, as the kernel recorded it (Linux's /proc), to its first
training batch: the interpreter's start and imports, the CLI's parse, the MLflow run's and the data's set-up, the
sanity check's validation. StartupClock, added to every trial through an extra config, logs it to the trial's run
as `bench_startup_s`, with the CPU time the process spent by then. Why this and not a fit's wall time less the
training time it reports: both ends are instants read on one clock (the kernel's time since boot), nothing is
estimated or subtracted (validation, checkpoints and the end of a fit are not training time either), and the figure
is the same whatever the trial's length; on shared cores its CPU time moves less with the load than its wall time.
A trial's whole time is the one its line prints, from the sweep starting its process to the process's end.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import lightning as L
import yaml

from scripts.bench.report import Report, run_command

STARTUP, STARTUP_CPU = "bench_startup_s", "bench_startup_cpu_s"


class StartupClock(L.Callback):
    """Logs STARTUP, the seconds from this process's start to its first training batch, and STARTUP_CPU, the CPU
    seconds this process spent by then, once (not on Linux: nothing)."""

    def __init__(self) -> None:
        self.logged = False

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, batch, batch_idx: int) -> None:
        if self.logged or not Path("/proc/self/stat").is_file():
            return
        self.logged = True
        # Field 22 of /proc/self/stat, after the parenthesised name: the process's start in clock ticks since boot.
        ticks = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])
        seconds = time.clock_gettime(time.CLOCK_BOOTTIME) - ticks / os.sysconf("SC_CLK_TCK")
        for logger in trainer.loggers:
            logger.log_metrics({STARTUP: seconds, STARTUP_CPU: time.process_time()}, step=trainer.global_step)


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


def timed_sweep(sweep_file: str, folder: Path, name: str, **changes) -> Path:
    """A copy of the sweep file named `name`, its sections changed as given, each trial with a StartupClock (after
    the callbacks its configs give: a config's list replaces the one before it)."""
    data = yaml.safe_load(Path(sweep_file).read_text())
    configs = [data["config"]] if isinstance(data["config"], str) else list(data["config"])
    callbacks = []
    for config in configs:
        callbacks = (yaml.safe_load(Path(config).read_text()) or {}).get("trainer", {}).get("callbacks", callbacks)
    clock = folder / "startup-clock.yaml"
    clock.write_text(
        yaml.safe_dump({"trainer": {"callbacks": [*callbacks, {"class_path": "scripts.bench.sweep.StartupClock"}]}})
    )
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump({**data, "config": [*configs, str(clock)], **changes}, sort_keys=False))
    return path


def startups(client, trials) -> list[tuple[float, float, float, int]]:
    """(start-up, its CPU, whole time in seconds, epochs) of each trial that reached a training batch."""
    found = []
    for trial in trials:
        run_id = trial.user_attrs["mlflow_run_id"]
        wall, cpu = (client.get_metric_history(run_id, name) for name in (STARTUP, STARTUP_CPU))
        if wall and cpu and trial.user_attrs.get("seconds"):
            found.append((wall[0].value, cpu[0].value, trial.user_attrs["seconds"], len(trial.intermediate_values)))
    return found


def minute_epochs(first: tuple[float, float, float, int]) -> int:
    """The epochs that make the trial `first` (startups') last about a minute."""
    startup, _, whole, epochs = first
    return max(1, round((60 - startup) / max(whole - startup, 0.01) * epochs))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sweep", default="configs/sweeps/penguins.yaml")
    parser.add_argument("--minute_epochs", type=int, default=0, help="epochs of the trial of about a minute (0: sized)")
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

        timed = timed_sweep(args.sweep, Path(folder), sweep.name)
        sweep_command = [sys.executable, "-m", "scripts.sweep", str(timed), "--outputs", str(outputs)]
        sweep_s, sweep_out = report.measured("sweep (python -m scripts.sweep)", took, run, sweep_command)
        study = optuna.load_study(study_name=sweep.name, storage=f"sqlite:///{outputs}/sweeps/optuna.db")
        states = [trial.state.name for trial in study.trials]
        epochs = sum(len(trial.intermediate_values) for trial in study.trials)
        best = at_best_epoch(client, study.best_trial.user_attrs["mlflow_run_id"])
        sweep_startups = startups(client, study.trials)
        best_config = outputs / "sweeps" / sweep.name / "best.yaml"
        best_command = [sys.executable, "-m", "scripts.train", "fit", *configs, "--config", str(best_config), *root]
        _, best_out = report.measured("best trial's config trained again", took, run, best_command)
        best_params = {"seed_everything": yaml.safe_load(best_config.read_text())["seed_everything"]}
        best_params |= study.best_trial.params

        first = startups(client, study.trials[:1])
        n = args.minute_epochs or (minute_epochs(first[0]) if first else 1)
        fixed = {**yaml.safe_load(Path(args.sweep).read_text()).get("fixed", {}), "trainer.max_epochs": n}
        fixed["trainer.min_epochs"] = n
        minute = timed_sweep(args.sweep, Path(folder), f"{sweep.name}-minute", budget={"trials": 1}, fixed=fixed)
        minute_command = [sys.executable, "-m", "scripts.sweep", str(minute), "--outputs", str(outputs)]
        report.measured(f"one trial of {n} epochs", took, run, minute_command)
        long = optuna.load_study(study_name=minute.stem, storage=f"sqlite:///{outputs}/sweeps/optuna.db")
        minute_startups = startups(client, long.trials)

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
    if not sweep_startups or not minute_startups:
        print("trial start-up: not measured (it reads the process's start from Linux's /proc)")
        return
    startup, cpu, whole, _ = (statistics.median(values) for values in zip(*sweep_startups))
    print(f"trial start-up (process start to first training batch), median of {len(sweep_startups)} trials: "
          f"{startup:.1f} s ({cpu:.1f} s of CPU) of {whole:.1f} s, {startup / whole:.0%}")  # fmt: skip
    ((startup, cpu, whole, _),) = minute_startups
    print(f"  one trial of {n} epochs: start-up {startup:.1f} s ({cpu:.1f} s of CPU) of {whole:.1f} s, "
          f"{startup / whole:.1%}")  # fmt: skip


if __name__ == "__main__":
    main()
