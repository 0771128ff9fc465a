"""scripts/bench/make_train.py runs end to end as `make bench` runs it, at its smallest (2 epochs, 1 round): each fresh
`make train` process's seconds as measured, then every variant's median and its ratio to the template's. Each variant
must change what it says it changes, or its figure would compare the template with itself.

.venv/bin/python -m pytest -q tests/bench/test_bench_make_train.py
"""

from __future__ import annotations

import gc
import re

import pytest

from scripts.bench.make_train import VARIANTS
from tests.bench.printed import assert_every_round, summary_figure
from tests.conftest import run_module


@pytest.mark.slow  # four fresh fits
def test_prints_every_variant_as_measured_then_its_median_and_ratio():
    result = run_module("scripts.bench.make_train", "--epochs", "2", "--rounds", "1")
    assert result.returncode == 0, result.stderr[-3000:]
    printed = result.stdout
    assert_every_round(printed, VARIANTS, "s", rounds=1)
    assert "make train of 2 epochs, a fresh process each, median of 1 rounds" in printed
    for variant in VARIANTS:
        assert summary_figure(printed, rf"^  {re.escape(variant)} +\S+ s +\(\S+\) +(\S+)x template$") > 0


def test_each_variant_turns_off_what_it_names(monkeypatch):
    """The patches and options do what the names say, on the objects the fit uses."""
    from datamodules.penguins import PenguinDataModule

    monkeypatch.setattr(PenguinDataModule, "evaluate_in_one_batch", True)
    exec(VARIANTS["eval in batches"][1], {})  # noqa: S102
    assert PenguinDataModule.evaluate_in_one_batch is False  # the class make train's fit uses, not a base of it
    assert VARIANTS["metrics per call"][0] == ["--trainer.logger.init_args.flush_every_s", "0"]
    frozen = gc.get_freeze_count()
    monkeypatch.setattr(gc, "freeze", gc.freeze)  # put back after
    exec(VARIANTS["collections at exit"][1], {})  # noqa: S102
    gc.freeze()
    assert gc.get_freeze_count() == frozen  # nothing moved out of the collector's reach
