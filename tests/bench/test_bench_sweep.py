"""The sweep bench's start-up clock (scripts/bench/sweep.py StartupClock): in a real fit it logs, once, to the fit's
run, the seconds from its process's start to its first training batch and the CPU spent by then.

.venv/bin/python -m pytest -q tests/bench/test_bench_sweep.py
"""

from __future__ import annotations

from mlflow import MlflowClient

from scripts.bench.sweep import STARTUP, STARTUP_CPU, minute_epochs


def test_a_fit_with_the_clock_logs_its_start_up_once(train_cli, tmp_path):
    args = ("--config", "configs/penguins.yaml", "--trainer.max_epochs", "2", "--test_after_fit", "false")
    result = train_cli("fit", *args, "--trainer.callbacks+", "scripts.bench.sweep.StartupClock")
    assert result.returncode == 0, result.stderr[-3000:]
    client = MlflowClient(f"sqlite:///{tmp_path}/outputs/mlflow.db")
    (run,) = client.search_runs([e.experiment_id for e in client.search_experiments()])
    (startup,), (cpu,) = (client.get_metric_history(run.info.run_id, name) for name in (STARTUP, STARTUP_CPU))
    assert startup.step == cpu.step == 0
    assert cpu.value > 0 and startup.value > 0


def test_the_trial_of_about_a_minute_takes_the_epochs_its_time_an_epoch_gives():
    assert minute_epochs((10.0, 6.0, 35.0, 100)) == 200  # 25 s of 100 epochs after a 10 s start: 50 s of 200
    assert minute_epochs((70.0, 60.0, 80.0, 10)) == 1  # a start-up past a minute still trains
