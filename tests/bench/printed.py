"""What a bench printed, read back: each run's figure as it was measured (`round N, NAME: FIGURE UNIT`, one line a
run: scripts/bench/report.py), and the lines of its summary."""

from __future__ import annotations

import re


def round_figures(printed: str, name: str, unit: str) -> dict[int, float]:
    """{round: figure} of the runs of `name`, from the lines that say `round N, NAME: FIGURE UNIT`."""
    lines = re.findall(rf"^round (\d+), {re.escape(name)}: ([\d.]+) {re.escape(unit)}$", printed, re.MULTILINE)
    return {int(number): float(figure) for number, figure in lines}


def assert_every_round(printed: str, names, unit: str, rounds: int) -> None:
    """Each of `names` printed a positive figure in every round, 1 to `rounds`, and in no other."""
    for name in names:
        figures = round_figures(printed, name, unit)
        assert sorted(figures) == list(range(1, rounds + 1)), f"{name}: rounds {sorted(figures)}\n{printed}"
        assert all(figure > 0 for figure in figures.values()), f"{name}: {figures}"


def summary_figure(printed: str, pattern: str) -> float:
    """The number that `pattern` (a regular expression of one whole line, one group) finds in `printed`."""
    found = re.search(pattern, printed, re.MULTILINE)
    assert found, f"no line like {pattern!r} in:\n{printed}"
    return float(found[1])
