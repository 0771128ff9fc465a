"""Lightning's fork-safe GPU check, kept where there is a GPU, dropped where there is none (it costs every Adam step).

.venv/bin/python -m pytest -q tests/test_gpu_lookups.py
"""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys

import pytest
import torch

from scripts.train import no_gpu_lookups_without_gpus

VARIABLE = "PYTORCH_NVML_BASED_CUDA_CHECK"


@pytest.fixture
def nvml_lookups(monkeypatch) -> list[str]:
    """The libraries torch asks ctypes to load from now on (NVML's is libnvidia-ml.so.1)."""
    loaded: list[str] = []
    real = ctypes.CDLL

    def counting(name, *args, **kwargs):
        loaded.append(str(name))
        return real(name, *args, **kwargs)

    monkeypatch.setattr(ctypes, "CDLL", counting)
    return loaded


def adam_step() -> None:
    weight = torch.nn.Parameter(torch.ones(3))
    optimizer = torch.optim.Adam([weight])
    weight.sum().backward()
    optimizer.step()


@pytest.mark.slow  # over 7 s of a worker: make test-fast stays under 2 minutes
def test_lightning_sets_the_variable_when_imported():
    # Why the CLI drops it: if Lightning stops setting it, this fails and no_gpu_lookups_without_gpus can go. (A
    # fresh interpreter: the CLI run in this process may have dropped it already.)
    code = f"import os, lightning; print(os.environ.get('{VARIABLE}'))"
    env = {key: value for key, value in os.environ.items() if key != VARIABLE}
    printed = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert printed.stdout.strip() == "1"


def test_with_the_variable_each_adam_step_looks_for_nvml(monkeypatch, nvml_lookups):
    # And if torch stops asking at every step, this fails. (Torch caches the answer once CUDA has started: no test
    # here starts it.)
    monkeypatch.setenv(VARIABLE, "1")
    adam_step()
    adam_step()
    assert nvml_lookups.count("libnvidia-ml.so.1") >= 2


def test_without_gpus_the_variable_goes_and_adam_steps_look_for_nothing(monkeypatch, nvml_lookups):
    monkeypatch.setenv(VARIABLE, "1")  # restored after the test
    with monkeypatch.context() as patched:
        patched.setattr(torch.cuda, "device_count", lambda: 0)
        no_gpu_lookups_without_gpus()
    assert VARIABLE not in os.environ
    adam_step()
    assert nvml_lookups == []


def test_with_a_gpu_the_variable_stays(monkeypatch):
    monkeypatch.setenv(VARIABLE, "1")
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    no_gpu_lookups_without_gpus()
    assert os.environ[VARIABLE] == "1"
