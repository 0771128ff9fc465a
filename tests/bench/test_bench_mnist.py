"""scripts/bench/mnist.py runs end to end on the real MNIST files: each variant in a process of its own, its rate
printed as it is measured, every other round in reverse order, every variant's median within its spread over the rounds,
and each ratio it promises, of the medians and round by round. Times are not checked (the bench is where they are read).

.venv/bin/python -m pytest -q tests/bench/test_bench_mnist.py
"""

from __future__ import annotations

import re

import pytest

from scripts.bench.mnist import VARIANTS
from tests.conftest import MNIST, needs_mnist, run_module


@pytest.mark.slow  # 12 short runs, each in a process of its own
@needs_mnist
def test_prints_every_run_as_measured_every_variant_and_the_template_s_ratios():
    result = run_module("scripts.bench.mnist", "--data-dir", MNIST, "--batches", "3", "--repeats", "2")
    assert result.returncode == 0, result.stderr[-3000:]
    printed = result.stdout
    runs = re.findall(r"^round (\d), (.+): \d+ samples/s$", printed, re.MULTILINE)
    assert runs == [("1", name) for name in VARIANTS] + [("2", name) for name in VARIANTS[::-1]]
    assert "mnist: 384 training samples, batch 128" in printed and "2 rounds" in printed
    for variant in VARIANTS:
        median, low, high = map(float, re.search(rf"^  {re.escape(variant)} +(\S+)  \((\S+)\.\.(\S+)\)$", printed,
                                                 re.MULTILINE).groups())  # fmt: skip
        assert 0 < low <= median <= high
    assert re.search(r"^  template / plain   (\S+)x \(medians\)$", printed, re.MULTILINE), printed
    by_round = re.search(r"^  template / plain   (\S+)x \(round by round: (\S+)\.\.(\S+)\)$", printed, re.MULTILINE)
    assert 0 < float(by_round[2]) <= float(by_round[1]) <= float(by_round[3])
    for ratio in (r"template / classic (\S+)x", r"plain channels-last / channels-first (\S+)x",
                  r"bare Lightning / plain (\S+)x, template / bare Lightning \S+x",
                  r"template / plain with the datamodule's data path (\S+)x: Lightning's loop"):  # fmt: skip
        assert float(re.search(rf"^  {ratio} \(medians\)$", printed, re.MULTILINE)[1]) > 0, printed


def test_no_rounds_is_refused():
    from scripts.bench import mnist

    with pytest.raises(SystemExit) as stop:
        mnist.main(["--repeats", "0"])
    assert stop.value.code == "error: argument --repeats: 0: give 1 or more"


def test_a_variant_that_fails_stops_the_bench_in_one_line_after_its_traceback(capfd, monkeypatch):
    from scripts.bench import mnist

    def broken(variant, data_dir, limit, accelerator):  # in the forked child: no torch work before it fails
        raise ValueError(f"{variant} broke")

    monkeypatch.setattr(mnist, "measure", broken)
    with pytest.raises(SystemExit) as stop:
        mnist.main(["--repeats", "1"])
    assert str(stop.value) == (
        "error: mnist bench: round 1, plain tensor loop failed: exit status 1 (its error is above)"
    )
    assert "ValueError: plain tensor loop broke" in capfd.readouterr().err
