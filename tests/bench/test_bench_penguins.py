"""scripts/bench/penguins.py runs end to end as `make bench` runs it, at its smallest (2 epochs, 1 round): each run's
ms/epoch as it is measured, then every variant's best with its ratio to the plain loop and make train's one-time
work. A variant that fails ends the bench in one line naming it, after the figures before it. Times are not checked
(the bench is where they are read).

.venv/bin/python -m pytest -q tests/bench/test_bench_penguins.py
"""

from __future__ import annotations

import math
import re

import pytest

from tests.bench.printed import assert_every_round, summary_figure
from tests.conftest import run_module

VARIANTS = (
    "plain tensor loop", "course loop (DataLoader, 1 worker)", "naive Lightning (DataLoader, self.log)",
    "bare Lightning (tensor batches, no metrics)", "template module + datamodule, no tracking",
    "make train (MLflow, checkpoints, callbacks)",
)  # fmt: skip


@pytest.mark.slow  # six short fits, one of them make train's
def test_prints_every_variant_as_measured_then_its_best_and_ratio():
    result = run_module("scripts.bench.penguins", "--epochs", "2", "--rounds", "1")
    assert result.returncode == 0, result.stderr[-3000:]
    printed = result.stdout
    assert_every_round(printed, VARIANTS, "ms/epoch", rounds=1)
    assert "penguins: 2 epochs, batch 20, 235 training rows, best of 1 rounds" in printed
    for variant in VARIANTS:
        assert summary_figure(printed, rf"^  {re.escape(variant)} +\S+ ms/epoch +(\S+)x plain$") > 0
    # A difference of two timings: on a busy machine noise can make it negative; it is printed as a number of seconds.
    assert math.isfinite(summary_figure(printed, r"^  make train's one-time work around its epochs .*: (\S+) s$"))


def test_a_variant_that_fails_ends_the_bench_in_one_line_after_the_figures_before_it(capsys, monkeypatch):
    from scripts.bench import penguins

    def broken(train, val, epochs):
        raise RuntimeError("the DataLoader's worker died")

    monkeypatch.setattr(penguins, "course", broken)
    with pytest.raises(SystemExit) as stop:
        penguins.main(["--epochs", "2", "--rounds", "1"])
    assert stop.value.code == (
        "error: penguins bench: round 1, course loop (DataLoader, 1 worker) failed: RuntimeError: the DataLoader's "
        "worker died"
    )
    assert re.fullmatch(r"round 1, plain tensor loop: \S+ ms/epoch\n", capsys.readouterr().out)


def test_one_epoch_is_refused_in_one_line():  # an epoch is timed from its start to the next one's
    result = run_module("scripts.bench.penguins", "--epochs", "1")
    assert result.returncode == 1 and result.stderr == "error: argument --epochs: 1: give 2 or more\n"
