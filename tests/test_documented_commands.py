"""Every command the README and docs/ show is one the code takes: each `python -m scripts.<verb> ...` (also after
torchrun, mpirun or horovodrun) is parsed by its own command line, nothing run. jsonargparse's commands parse it with
--print_config (a renamed or mistyped option fails there; --help would stop before checking); the argparse ones
(score, plot, build_horovod, the benches) must list every option it gives in their --help. A renamed option fails
this test, not a user. A shown `make predict`, `evaluate` or `validate` (which find their checkpoint by the fit's data:
scripts/checkpoint_of.py) must find the one of a fit shown in its block: the fits' config.yaml as they would record it
(--print_config), the commands as `make -n` spells them.
"""

from __future__ import annotations

import contextlib
import importlib
import io
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
# Every page that tells a user what to type; docs/measured.md records what ran on a date, as it ran.
PAGES = [REPO / "README.md", *sorted(page for page in (REPO / "docs").glob("*.md") if page.name != "measured.md")]
# The commands that parse with jsonargparse (their --print_config parses everything given).
PRINT_CONFIG = {"scripts.train", "scripts.submit", "scripts.sweep", "scripts.serve", "scripts.deploy", "scripts.export",
                "scripts.assets", "scripts.pipeline"}  # fmt: skip
SHELL_ENDS = {"|", ">", ">>", "2>", "2>&1", "&&", ";", "&"}


def documented_commands() -> list[tuple[str, str, list[str]]]:
    """(where, module, args) of every command shown: whole lines of fenced blocks (not of ```text blocks, which show
    what a command printed), `inline code` elsewhere."""
    found = []
    for page in PAGES:
        fenced = output = False
        lines = page.read_text().replace("\\\n", " ").splitlines()
        for number, line in enumerate(lines, 1):
            if line.lstrip().startswith("```"):
                fenced, output = not fenced, line.strip() == "```text"  # ```text: what a command printed
                continue
            if output:
                continue
            texts = [line] if fenced else re.findall(r"`([^`]*-m scripts\.[^`]*)`", line)
            for text in texts:
                at = text.find("-m scripts.")
                if at < 0:
                    continue
                tokens = shlex.split(text[at:], comments=True)[1:]
                args = []
                for token in tokens[1:]:
                    if token in SHELL_ENDS:
                        break
                    args.append(token)
                found.append((f"{page.relative_to(REPO)}:{number}", tokens[0], args))
    return found


COMMANDS = documented_commands()


def run_main(module: str, args: list[str]) -> tuple[int, str]:
    """The command's main() on `args` in this process: its exit status and what it printed."""
    main = importlib.import_module(module).main
    output = io.StringIO()
    argv, sys.argv = sys.argv, [module]  # as `python -m module` has it (LightningCLI warns of pytest's arguments)
    with contextlib.ExitStack() as restore:
        restore.callback(setattr, sys, "argv", argv)
        restore.enter_context(contextlib.redirect_stdout(output))
        restore.enter_context(contextlib.redirect_stderr(output))
        try:
            main(args)
            status = 0
        except SystemExit as stop:
            status = stop.code if isinstance(stop.code, int) else (0 if stop.code is None else 1)
            if not isinstance(stop.code, int | None):
                output.write(str(stop.code))
    return status, output.getvalue()


def test_the_pages_show_commands_of_every_kind():
    modules = {module for _, module, _ in COMMANDS}
    assert {"scripts.train", "scripts.drop"} <= modules
    assert {"scripts.submit", "scripts.assets"} <= modules  # extra: azure
    assert {"scripts.pipeline", "scripts.deploy"} <= modules  # extra: azure, serving
    assert {"scripts.sweep"} <= modules  # extra: sweeps
    assert {"scripts.spark"} <= modules  # extra: spark
    assert {"scripts.serve", "scripts.score", "scripts.export"} <= modules  # extra: serving
    assert {"scripts.build_horovod"} <= modules  # extra: horovod
    assert any(module.startswith("scripts.bench.") for module in modules)  # extra: bench


@pytest.mark.parametrize(("where", "module", "args"), COMMANDS, ids=[where for where, _, _ in COMMANDS])
def test_a_documented_command_parses(where, module, args):
    # extra: spark
    if module == "scripts.spark" and args[:1] == ["score"]:  # a model, an input and its own options
        from scripts.spark import split_score_options

        split_score_options(args[1:])
        return
    if module == "scripts.spark":  # its own two options, then scripts.train fit's
        from scripts.spark.launch import split_options

        _, _, rest = split_options(args)
        module, args = "scripts.train", ["fit", *rest]
    # end extra: spark
    if module in PRINT_CONFIG:
        status, output = run_main(module, [*args, "--print_config"])
        assert status == 0, f"{where}: python -m {module} {shlex.join(args)}\n{output}"
        return
    status, output = run_main(module, ["--help"])
    assert status == 0 and "usage" in output, f"{where}: python -m {module} --help\n{output}"
    for option in (arg.split("=")[0] for arg in args if arg.startswith("--")):
        assert option in output, f"{where}: python -m {module} has no option {option}"


def test_a_renamed_option_fails_the_parse():
    status, output = run_main("scripts.train", ["fit", "--config", "configs/penguins.yaml", "--trainer.max_epoks", "5",
                                                "--print_config"])  # fmt: skip
    assert status == 1 and "--trainer.max_epoks" in output


# extra: azure
def test_a_renamed_option_of_a_job_fails_the_parse():
    status, output = run_main("scripts.submit", ["configs/penguins.yaml", "--computer", "c", "--print_config"])
    assert status == 1 and "--computer" in output


# end extra: azure


COMMAND_MODULES = sorted(
    [f"scripts.{path.stem}" for path in (REPO / "scripts").glob("*.py") if path.stem != "__init__"]
    + [f"scripts.{path.parent.name}" for path in (REPO / "scripts").glob("*/__main__.py")]  # a package run with -m
)


@pytest.mark.parametrize("flag", ["--help", "-h"])
@pytest.mark.parametrize("module", COMMAND_MODULES)
def test_every_command_answers_help_with_its_usage(module, flag):
    status, output = run_main(module, [flag])
    assert status == 0 and "usage" in output.lower(), output
    assert "error" not in output.lower().split("usage")[0], output


def test_a_subcommands_help_lists_its_options():
    for module, args, option in [
        ("scripts.spark", ["fit", "--help"], "--num_processes"),  # extra: spark
        ("scripts.spark", ["fit", "--help"], "--trainer.max_epochs"),  # extra: spark
        ("scripts.train", ["fit", "--help"], "--checkpoint_dir"),
        ("scripts.deploy", ["online", "--help"], "--endpoint"),  # extra: azure, serving
    ]:
        status, output = run_main(module, args)
        assert status == 0 and option in output, (module, args, output)


# ---- documented make lines: predict, evaluate and validate find the checkpoint of the fit shown beside them --------
LOOKUPS = ("predict", "evaluate", "validate")  # the verbs that look the checkpoint up by the fit's data


def fenced_blocks() -> list[tuple[str, list[tuple[int, str]]]]:
    """(page, its (line number, text) pairs) of each fenced block of each page, but ```text ones (what a command
    printed)."""
    blocks = []
    for page in PAGES:
        lines, shown = None, False
        for number, line in enumerate(page.read_text().replace("\\\n", " ").splitlines(), 1):
            if line.lstrip().startswith("```") and lines is None:
                lines, shown = [], line.strip() != "```text"
            elif line.lstrip().startswith("```"):
                blocks += [(str(page.relative_to(REPO)), lines)] if shown else []
                lines = None
            elif lines is not None:
                lines.append((number, line))
    return blocks


def make_lookups() -> list[tuple[str, list[str], list[list[str]]]]:
    """(where, arguments after `make`, the fits shown in its block) of each `make predict|evaluate|validate` line; a fit
    is `make train ...`'s arguments, or `python -m scripts.train fit ...`'s as ["-", ...]."""
    found = []
    for page, lines in fenced_blocks():
        makes = [(number, shlex.split(text, comments=True)[1:]) for number, text in lines if text.startswith("make ")]
        fits = [arguments for _, arguments in makes if arguments[0] == "train"]
        for _, text in lines:
            if "-m scripts.train fit " in text:
                tokens = shlex.split(text[text.find("-m scripts.train") :], comments=True)[2:]
                ends = [index for index, token in enumerate(tokens) if token in SHELL_ENDS]
                fits.append(["-", *tokens[: ends[0] if ends else len(tokens)]])
        found += [(f"{page}:{number}", arguments, fits) for number, arguments in makes if arguments[0] in LOOKUPS]
    return found


def made(arguments: list[str], module: str) -> list[str]:
    """The arguments `make -n` (nothing run) gives `python -m <module>` in the recipe of `make <arguments>`."""
    venv = Path(sys.executable).parent.parent
    # Not the variables of a `make test ARGS=...` that runs this test: make exports those given on its command line,
    # and from the environment ARGS (or any other the Makefile defaults with ?=) would reach the recipe as its own.
    env = {name: value for name, value in os.environ.items() if name not in ("MAKEFLAGS", "MAKELEVEL", "MFLAGS")}
    for name in re.findall(r"^([A-Z_]+) *\?=", (REPO / "Makefile").read_text(), re.MULTILINE):
        env.pop(name, None)
    command = ["make", "-n", "--no-print-directory", f"--old-file={venv}/installed", f"VENV={venv}", *arguments]
    dry = subprocess.run(command, cwd=REPO, capture_output=True, text=True, check=True, env=env).stdout
    (command,) = re.findall(rf"-m {re.escape(module)} ([^)\n]*)", dry)
    return shlex.split(command)


LOOKUP_LINES = make_lookups()


def test_the_pages_show_make_predict_lines():
    assert {arguments[0] for _, arguments, _ in LOOKUP_LINES} >= {"predict"}


@pytest.mark.parametrize(("where", "arguments", "fits"), LOOKUP_LINES, ids=[where for where, _, _ in LOOKUP_LINES])
def test_a_documented_make_predict_finds_the_checkpoint_of_a_fit_shown_beside_it(where, arguments, fits, tmp_path):
    from scripts.checkpoint_of import checkpoint_of

    assert fits, f"{where}: make {shlex.join(arguments)} shows no fit beside it"
    runs = []
    for index, fit in enumerate(fits):  # each fit's run folder as scripts.train leaves it: config.yaml, best.ckpt
        args = fit[1:] if fit[0] == "-" else made(fit, "scripts.train")
        status, config = run_main("scripts.train", [*args, "--print_config"])
        assert status == 0, f"{where}: python -m scripts.train {shlex.join(args)}\n{config}"
        (tmp_path / "1" / str(index) / "checkpoints").mkdir(parents=True)
        (tmp_path / "1" / str(index) / "config.yaml").write_text(config)
        runs.append(tmp_path / "1" / str(index) / "checkpoints" / "best.ckpt")
        runs[-1].write_bytes(b"")
    try:
        found = checkpoint_of([*made(arguments, "scripts.checkpoint_of"), "--trainer.default_root_dir", str(tmp_path)])
    except SystemExit as refused:
        pytest.fail(f"{where}: make {shlex.join(arguments)}, after the fit shown beside it, is refused: {refused}")
    assert found in runs
    command = [str(found) if arg == "$ckpt" else arg for arg in made(arguments, "scripts.train")]
    status, output = run_main("scripts.train", [*command, "--print_config"])  # the command it then runs parses
    assert status == 0, f"{where}: python -m scripts.train {shlex.join(command)}\n{output}"
