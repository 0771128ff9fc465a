"""`python -m scripts.train` ends without Python's last collections, whether its command succeeded or failed
(scripts/train.py `run`; what it saves: docs/architecture.md).

.venv/bin/python -m pytest -q tests/test_process_end.py
"""

from __future__ import annotations

import gc

import pytest

from scripts import train


@pytest.mark.parametrize("ending", [None, SystemExit(1), RuntimeError("a crash")])
def test_the_process_ends_frozen_after_its_command_whatever_its_end(monkeypatch, ending):
    events: list[str] = []

    def command() -> None:
        events.append("main")
        if ending is not None:
            raise ending

    monkeypatch.setattr(train, "main", command)
    monkeypatch.setattr(gc, "freeze", lambda: events.append("freeze"))
    if ending is None:
        train.run()
    else:
        with pytest.raises(type(ending)):  # the command's own end: its exit status, or its traceback
            train.run()
    assert events == ["main", "freeze"]
