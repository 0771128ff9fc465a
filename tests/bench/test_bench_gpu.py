"""make bench-gpu (scripts/bench/gpu.sh) on a machine without an NVIDIA GPU: one line, exit status 1, nothing written.
Its steps themselves run only on a GPU machine (docs/measured.md, "On a GPU"); here, each step's command is parsed by
the command it runs (a bench's options, scripts.train's with --print_config, the launchers' own), nothing run, so
that a renamed module or option fails a test, not a session on a GPU machine.

.venv/bin/python -m pytest -q tests/bench/test_bench_gpu.py
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import os
import re
import shlex
import string
import subprocess
import sys

import pytest

from tests.conftest import REPO
from tests.test_documented_commands import run_main


def test_without_a_gpu_it_says_so_in_one_line_and_writes_nothing(tmp_path):
    tools = tmp_path / "bin"
    tools.mkdir()
    (tools / "nvidia-smi").write_text("#!/bin/sh\necho 'NVIDIA-SMI has failed: no devices' >&2\nexit 9\n")
    (tools / "nvidia-smi").chmod(0o755)
    logs = tmp_path / "logs"
    env = {**os.environ, "PATH": f"{tools}:{os.environ['PATH']}", "LOGS": str(logs)}
    result = subprocess.run(["bash", "scripts/bench/gpu.sh"], cwd=REPO, env=env, capture_output=True, text=True)
    assert result.returncode == 1
    assert result.stderr == (
        "error: make bench-gpu needs an NVIDIA GPU, and nvidia-smi finds none here; run it on a GPU machine\n"
    )
    assert result.stdout == "" and not logs.exists()


GPU_SH = REPO / "scripts" / "bench" / "gpu.sh"
# What gpu.sh's shell variables and arithmetic stand for here: this machine's cores and one GPU.
CORES = os.cpu_count() or 1
VALUES = {"PY": sys.executable, "MNIST_DIR": "data/mnist", "GPUS": "1", "LOGS": "outputs/bench-gpu"}
SHELL_ENDS = {">", ">>", "2>", "2>&1", "&&", "||", ";", "|", "&"}


def shell_lines() -> list[str]:
    """gpu.sh's lines, a line continued by a backslash or by an open quote joined to the next."""
    lines, pending = [], ""
    for line in GPU_SH.read_text().replace("\\\n", " ").splitlines():
        pending += line + "\n"
        try:
            shlex.split(pending, comments=True)
        except ValueError:  # a quote still open
            continue
        lines.append(pending)
        pending = ""
    return lines


def gpu_commands() -> list[list[str]]:
    """Every `"$PY" ...` command of gpu.sh, as its words, once for each value of the loop it is in (`for X in ...`),
    its variables given VALUES."""
    commands, loop = [], {"": [""]}
    for line in shell_lines():
        if found := re.match(r"\s*for (\w+) in ([^;]+); do", line):
            loop = {found[1]: found[2].split()}
        elif line.strip() == "done":
            loop = {"": [""]}
        elif '"$PY" ' in line and not line.lstrip().startswith("#"):
            line = re.sub(r"\$\(\(\$\(nproc\) - (\d+)\)\)", lambda found: str(max(0, CORES - int(found[1]))), line)
            ((name, values),) = loop.items()
            for value in values:
                words = shlex.split(line[line.find('"$PY" ') :], comments=True)
                ends = [i for i, word in enumerate(words) if word in SHELL_ENDS]
                known = {**VALUES, name: value}
                commands.append([string.Template(word).substitute(known) for word in words[: min(ends, default=None)]])
    return commands


def check_command(words: list[str], monkeypatch) -> None:
    """The command parses: `python -c` code compiles and its imports resolve; `python -m` a module that exists, given
    options it takes (a launcher's, then the command it launches)."""
    assert words[0] == sys.executable, words
    if words[1] == "-c":
        code = ast.parse(words[2])
        imported = [alias.name for node in ast.walk(code) if isinstance(node, ast.Import) for alias in node.names]
        for name in imported:
            if not name.startswith("horovod"):  # gpu.sh asks whether Horovod is there
                assert importlib.util.find_spec(name), name
        return
    assert words[1] == "-m", words
    module, args = words[2], words[3:]
    if module == "torch.distributed.run":
        from torch.distributed.run import get_args_parser

        launched = get_args_parser().parse_args(args)
        assert launched.module
        module, args = launched.training_script, launched.training_script_args
    if module == "horovod.runner.launch":
        at = args.index(sys.executable)  # horovodrun's options, then the command of each process
        if importlib.util.find_spec("horovod"):  # where gpu.sh finds no Horovod, it skips the step
            from horovod.runner.launch import parse_args

            monkeypatch.setattr(sys, "argv", ["horovodrun", *args])
            assert parse_args().command == args[at:]
        check_command(args[at:], monkeypatch)
        return
    if module.startswith("scripts.bench."):
        importlib.import_module(module).parse_options(args)  # argparse's mistakes exit
        return
    status, output = run_main(module, [*args, "--print_config"])
    assert status == 0, f"python -m {module} {shlex.join(args)}\n{output}"


def test_every_step_runs_a_module_that_exists_with_options_it_takes(monkeypatch):
    """A renamed module or option fails here, not in a session on a GPU machine."""
    commands = gpu_commands()
    modules = [words[2] for words in commands if words[1] == "-m"]
    assert modules == ["scripts.bench.birds", "scripts.bench.birds", "scripts.bench.mnist", "scripts.train",
                       "torch.distributed.run", "horovod.runner.launch"]  # fmt: skip
    assert [words[4] for words in commands[1:3]] == ["resnet50", "efficientnet_lite0"]
    for words in commands:
        check_command(words, monkeypatch)


def test_a_renamed_option_of_a_step_fails_the_check(monkeypatch):
    birds = next(words for words in gpu_commands() if "scripts.bench.birds" in words)
    with pytest.raises(SystemExit):
        check_command([*birds, "--batch-sise", "8"], monkeypatch)
    train = next(words for words in gpu_commands() if words[2] == "scripts.train")
    with pytest.raises(AssertionError, match="max_epoks"):
        check_command([*train, "--trainer.max_epoks", "2"], monkeypatch)
