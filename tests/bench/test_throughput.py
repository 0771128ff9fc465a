"""EpochThroughput's clock: on a GPU it waits for the epoch's last step to finish before it stops, once an epoch; on
a CPU it never calls CUDA. (The rate itself is checked where runs log it: test_cli_penguins, test_stop_and_resume.)

.venv/bin/python -m pytest -q tests/bench/test_throughput.py
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from scripts.bench.throughput import EpochThroughput


@pytest.mark.parametrize("device, waits", [("cuda", [3]), ("cpu", [])])
def test_the_clock_waits_for_the_gpu_at_the_epoch_s_last_batch_only(monkeypatch, device, waits):
    waited = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda where=None: waited.append(batch_index))
    trainer = SimpleNamespace(num_training_batches=4, world_size=2)
    module = SimpleNamespace(device=torch.device(device, 0) if device == "cuda" else torch.device(device))
    clock = EpochThroughput()
    clock.on_train_epoch_start(trainer, module)
    for batch_index in range(4):
        clock.on_train_batch_end(trainer, module, None, (torch.zeros(8, 3), torch.zeros(8)), batch_index)
    assert waited == waits
    assert clock.samples == 4 * 8 * 2
