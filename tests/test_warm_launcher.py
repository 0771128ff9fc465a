"""The tests' warm launcher (tests/warm_launcher.py) leaves nothing behind in the temporary directory."""

from __future__ import annotations

from tests import warm_launcher
from tests.conftest import REPO


def test_a_command_only_waited_for_leaves_no_folder_and_still_gives_its_output():
    command = warm_launcher.start("platform", [], REPO)
    assert command.wait(timeout=120) == 0
    assert not command.folder.exists()
    stdout, stderr = command.communicate()
    assert stdout.startswith("Linux"), (stdout, stderr)


def test_a_killed_command_leaves_no_folder():
    command = warm_launcher.start("timeit", ["-n", "1", "import time; time.sleep(600)"], REPO)
    command.kill()
    assert command.wait(timeout=120) == -9
    assert not command.folder.exists()
