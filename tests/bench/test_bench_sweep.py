"""scripts/bench/sweep.py runs end to end as `make bench` runs it, at its smallest: a sweep file of one trial of 2
epochs around configs/penguins.yaml. Each command's wall time as it ends, then the sweep against the default fit, the
trials' states, both validation figures at their best epoch, both test accuracies and the best values. Times are not
checked (the bench is where they are read).

.venv/bin/python -m pytest -q tests/bench/test_bench_sweep.py
"""

from __future__ import annotations

import re

import pytest
import yaml

from tests.bench.printed import summary_figure
from tests.conftest import run_module


def tiny_sweep(folder) -> str:
    (folder / "two_epochs.yaml").write_text(yaml.safe_dump({"trainer": {"max_epochs": 2}}))
    sweep = {
        "config": ["configs/penguins.yaml", str(folder / "two_epochs.yaml")],
        "objective": {"metric": "val_loss", "goal": "minimize"},
        "sampling": {"algorithm": "random", "seed": 42},
        "budget": {"trials": 1},
        "early_termination": {"policy": "median", "delay_evaluation": 1, "evaluation_interval": 1},
        "search_space": {"model.optimizer.init_args.lr": {"loguniform": [1.0e-3, 1.0e-1]}},
    }
    (folder / "tiny.yaml").write_text(yaml.safe_dump(sweep))
    return str(folder / "tiny.yaml")


@pytest.mark.slow  # three fits and a sweep, each a process of its own
def test_prints_each_command_as_it_ends_then_the_sweep_against_the_default_fit(tmp_path):
    sweep = tiny_sweep(tmp_path)
    result = run_module("scripts.bench.sweep", "--sweep", sweep)
    assert result.returncode == 0, result.stderr[-3000:]
    printed = result.stdout
    for command in ("default config, one fit", "sweep (python -m scripts.sweep)", "best trial's config trained again"):
        assert summary_figure(printed, rf"^{re.escape(command)}: (\S+) s$") > 0
    assert f"{sweep}: 1 trials, random sampling, median early termination" in printed
    assert summary_figure(printed, r"^  sweep \(python -m scripts.sweep\) +\S+ s +(\S+)x the default fit$") > 0
    assert "  trials: 1 complete, 0 pruned, 0 fail; 2 epochs trained in all" in printed
    assert "  pruned: trials none" in printed
    for config in ("default config", r"best trial \( 0\)"):
        assert 0 < summary_figure(printed, rf"^    {config} +(\S+) +\S+$") <= 1
    assert 0 < summary_figure(printed, r"^  test_acc: default (\S+), best config trained again \S+$") <= 1
    assert 0 < summary_figure(printed, r"^  test_acc: default \S+, best config trained again (\S+)$") <= 1
    assert "  best values: seed_everything 42, model.optimizer.init_args.lr " in printed
