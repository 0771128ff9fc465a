"""scripts/bench/report.py: a bench's figure printed the moment it is measured, a step that fails as one line naming
the bench and the step (exit status 1) after the figures before it, and a command's failure read down to its error
line.

.venv/bin/python -m pytest -q tests/bench/test_report.py
"""

from __future__ import annotations

import sys

import pytest

from scripts.bench.report import BenchError, Report, error_line, run_command


def test_figures_print_as_measured_and_a_failing_step_is_the_last_line(capsys):
    report = Report("demo")
    assert report.measured("round 1, fast", lambda s: f"{s:.1f} s", lambda a, b: a + b, 1.0, 0.5) == 1.5

    def broken():
        raise ValueError("the data went away\nsecond line of the message")

    with pytest.raises(SystemExit) as stop:
        report.measured("round 1, slow", str, broken)
    assert capsys.readouterr().out == "round 1, fast: 1.5 s\n"
    assert stop.value.code == "error: demo bench: round 1, slow failed: ValueError: the data went away"


def test_a_bench_error_is_its_own_line_and_an_exit_passes_through():
    def refused():
        raise BenchError("it did not start: port taken")

    report = Report("demo")
    with pytest.raises(SystemExit) as stop:
        report.step("starting the server", refused)
    assert stop.value.code == "error: demo bench: starting the server failed: it did not start: port taken"
    with pytest.raises(SystemExit) as stop:  # a step's own one-line exit (an option refused) is not wrapped
        report.step("checking", sys.exit, "error: --rounds 0: give 1 to 100")
    assert stop.value.code == "error: --rounds 0: give 1 to 100"


def test_the_error_line_of_a_command_s_output():
    traceback = "Traceback (most recent call last):\n  File 'x.py'\nImportError: cannot import name 'LocalSpark'\n"
    torchrun = traceback + "E1129 failed (exitcode: 1)\nChildFailedError: \n=======\nscripts.train FAILED\n=======\n"
    assert error_line(torchrun) == "ImportError: cannot import name 'LocalSpark'"
    assert error_line("Seed set\nerror: --trainer.max_epochs 0: give 1 or more\n") == (
        "error: --trainer.max_epochs 0: give 1 or more"
    )
    assert error_line("nothing like an error\nlast words\n\n") == "last words"
    assert error_line("") == "it printed nothing"


def test_a_command_that_fails_is_a_bench_error_with_its_status_and_error_line():
    assert run_command([sys.executable, "-c", "print('fine')"]).stdout == "fine\n"
    with pytest.raises(BenchError) as failed:
        run_command([sys.executable, "-c", "import sys; print('chatter'); sys.exit('error: no data here')"])
    assert str(failed.value) == "exit status 1: error: no data here"
