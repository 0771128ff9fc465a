"""The tests' warm launcher (tests/warm_launcher.py) leaves nothing behind in the temporary directory, and gives a
command the temporary directory its environment names."""

from __future__ import annotations

from tests import warm_launcher
from tests.conftest import REPO, own_tmpdir


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


def test_a_command_s_temporary_folder_is_its_own_tmpdir_as_in_a_fresh_interpreter(tmp_path):
    # A launcher such as torchrun leaves its log folder there: the tests give it theirs (tests/conftest.py own_tmpdir).
    (tmp_path / "probe.py").write_text("import tempfile\nprint(tempfile.gettempdir())\n")
    env = own_tmpdir(tmp_path)
    result = warm_launcher.run("probe", [], tmp_path, env)
    assert result.stdout == f"{env['TMPDIR']}\n", result.stderr
