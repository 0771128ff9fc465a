"""scripts/bench/loop_cost.py runs end to end on the real MNIST files and prints what its docstring promises, each
run's median as it is measured (the bars draw into temporary files, not here); a --steps too small to time anything is
refused in one line. Times are not checked (the bench is where they are read).

.venv/bin/python -m pytest -q tests/bench/test_bench_loop_cost.py
"""

from __future__ import annotations

import re

import pytest

from scripts.bench import loop_cost
from tests.bench.printed import assert_every_round
from tests.conftest import MNIST, needs_mnist


@needs_mnist
@pytest.mark.slow  # seconds of a worker: make test-fast stays under 2 minutes
def test_prints_every_variant_and_what_lightning_costs_a_step(capsys):
    loop_cost.main(["--data-dir", str(MNIST), "--steps", "15", "--repeats", "2"])
    printed = capsys.readouterr().out
    variants = ("plain loop", "stock Lightning", "template's module, Trainer", "+ Lightning's bar, to a file",
                "+ template's bar, to a file", "plain loop, MNISTNet")  # fmt: skip
    assert_every_round(printed, variants, "µs a step", rounds=2)
    assert "loop cost: 15 steps of batch 128" in printed and "2 rounds" in printed
    for variant in variants:
        median, low, high = map(float, re.search(rf"^  {re.escape(variant)} +(\S+)  \((\S+)\.\.(\S+)\)$", printed,
                                                 re.MULTILINE).groups())  # fmt: skip
        assert 0 < low <= median <= high
    costs = re.findall(r"^  (stock Lightning|template's module, Trainer): ([+-]\d+) µs a step, .* ceiling (\S+)x$",
                       printed, re.MULTILINE)  # fmt: skip
    assert [name for name, _, _ in costs] == ["stock Lightning", "template's module, Trainer"]
    bars = re.findall(r"^  (Lightning's|template's) bar, to a file: [+-]\d+ µs a step, \S+% of an MNIST step$", printed,
                      re.MULTILINE)  # fmt: skip
    assert bars == ["Lightning's", "template's"]


def test_too_few_steps_to_time_are_refused():
    with pytest.raises(SystemExit) as stop:  # the first 10 are not timed
        loop_cost.main(["--steps", "11"])
    assert stop.value.code == "error: argument --steps: 11: give 12 to 430"
