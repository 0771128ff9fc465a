"""scripts/bench/spark.py runs end to end as `make bench-spark` runs it, at its smallest (2 epochs, 1 round, a
`local[2]` master: one JVM): each launcher's wall time and epoch as they are measured, then each one's against
torchrun's and TorchDistributor's floor. Times are not checked (the bench is where they are read).

.venv/bin/python -m pytest -q tests/bench/test_bench_spark.py
"""

from __future__ import annotations

import re
import shutil

import pytest

from tests.bench.printed import summary_figure
from tests.conftest import own_tmpdir, run_module

LAUNCHERS = ("torchrun --standalone", "scripts.spark", "scripts.spark, session already running")


@pytest.mark.slow  # a torchrun fit, two fits on Spark and a Spark session
@pytest.mark.skipif(
    shutil.which("java") is None, reason="needs Java 17 for Spark (apt-get install openjdk-17-jre-headless; CI has it)"
)
def test_prints_every_launcher_as_measured_then_its_ratios_to_torchrun(tmp_path):
    args = ("--epochs", "2", "--rounds", "1", "--master", "local[2]")
    result = run_module("scripts.bench.spark", *args, env=own_tmpdir(tmp_path))
    assert result.returncode == 0, result.stderr[-3000:]
    printed = result.stdout
    for launcher in LAUNCHERS:
        line = rf"^round 1, {re.escape(launcher)}: wall (\S+) s, epoch \S+ ms$"
        assert summary_figure(printed, line) > 0
    assert "penguins fit, 2 DDP processes (gloo), 2 epochs, best of 1 rounds" in printed
    for label in ("torchrun --standalone", "scripts.spark (local[2])", "scripts.spark, session already running"):
        ratios = re.search(rf"^  {re.escape(label)} +wall +\S+ s +(\S+)x +epoch +\S+ ms +(\S+)x +start-up, test and "
                           r"shutdown +\S+ s$", printed, re.MULTILINE)  # fmt: skip
        assert ratios and float(ratios[1]) > 0 and float(ratios[2]) > 0, printed
    line = r"^  TorchDistributor.run of a function that returns at once, session running: (\S+) s$"
    assert summary_figure(printed, line) > 0
