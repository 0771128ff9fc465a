"""scripts/bench/table.py runs end to end as `make bench` runs it, at a tiny size (2,000 and 4,000 rows, 1 round): each
streamed fit's peak RSS and epoch speed, each plain loop's and bare Lightning's speed as measured, then each size's
medians, its ratios to the plain loop and to bare Lightning, and the largest size's peak RSS against the smallest's.
Figures are not checked (the bench is where they are read); sizes too small are refused in one line.

.venv/bin/python -m pytest -q tests/bench/test_bench_table.py
"""

from __future__ import annotations

import pytest

from scripts.bench import table
from tests.bench.printed import assert_every_round, summary_figure
from tests.conftest import run_module


@pytest.mark.slow  # two short fits through scripts.train
def test_prints_each_size_s_peak_memory_and_speed_against_a_plain_loop():
    result = run_module("scripts.bench.table", "--rows", "2000,4000", "--repeats", "1", "--threads", "1")
    assert result.returncode == 0, result.stderr[-3000:]
    printed = result.stdout
    for rows in (2000, 4000):
        assert_every_round(printed, [f"streamed fit of {rows} rows"], "MB peak", rounds=1)
        speeds = [f"streamed epoch of {rows} rows", f"plain loop of {rows} rows", f"bare Lightning of {rows} rows"]
        assert_every_round(printed, speeds, "rows/s", 1)
        assert_every_round(printed, [f"streamed epoch against the plain loop of {rows} rows"], "times", 1)
        ratio = summary_figure(printed, rf"^  {rows} rows: peak RSS \d+ MB, fit \S+ s; epoch \d+ rows/s, plain loop "
                                        r"\d+ rows/s: (\S+)x$")  # fmt: skip
        assert ratio > 0
        line = rf"^  {rows} rows: bare Lightning \d+ rows/s: (\S+)x of the plain loop; the epoch \S+x of bare Lightning"
        assert summary_figure(printed, line) > 0
    assert "table: 2000, 4000 rows x 30 columns, batch 1024, budget 64 MB, 1 threads" in printed
    summary_figure(printed, r"^  peak RSS, 4000 rows against 2000: ([+-]\d+) MB \(goal: within 300\)$")


def test_sizes_too_small_or_not_numbers_are_refused_in_one_line():
    with pytest.raises(SystemExit) as stop:
        table.main(["--rows", "1000000,500"])
    assert stop.value.code == "error: argument --rows: 1000000,500: give 2000 rows or more a size"
    with pytest.raises(SystemExit) as stop:
        table.main(["--rows", "1M"])
    assert stop.value.code == "error: argument --rows: 1M: give whole numbers, comma-separated (1000000,4000000)"
