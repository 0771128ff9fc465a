"""The tests' warm launcher (tests/warm_launcher.py) runs a command as `python -m` would and ends it as the interpreter
would, leaves nothing behind in the temporary directory, and gives a command the temporary directory its environment
names."""

from __future__ import annotations

import os
import signal

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


def test_a_command_runs_as_python_m_would_and_ends_as_the_interpreter_would(tmp_path):
    (tmp_path / "program.py").write_text(
        "import os, sys, time\n"
        "print(os.environ['LAUNCHED_SAYS'], os.getcwd(), sys.argv[1:], flush=True)\n"
        "action = sys.argv[1]\n"
        "if action == 'exit': sys.exit(3)\n"
        "if action == 'raise': raise RuntimeError('raised in the child')\n"
        "if action == 'message': sys.exit('a message to the user')\n"
        "if action == 'interrupt': raise KeyboardInterrupt\n"
        "if action == 'finish':\n"  # what the interpreter's end does: join threads, run exit handlers, flush
        "    import atexit, threading, weakref\n"
        "    atexit.register(lambda: print('exit handler ran'))\n"
        "    class Kept: pass\n"
        "    kept = Kept()\n"
        "    weakref.finalize(kept, print, 'finalizer ran')\n"
        "    threading.Thread(target=lambda: (time.sleep(1), print('thread joined'))).start()\n"
        "    print('unflushed line', end='')\n"
    )
    env = {**os.environ, "LAUNCHED_SAYS": "hello"}
    actions = ("exit", "raise", "message", "interrupt", "finish")
    commands = {action: warm_launcher.start("program", [action], tmp_path, env) for action in actions}
    statuses = {action: command.wait(timeout=120) for action, command in commands.items()}
    assert statuses == {"exit": 3, "raise": 1, "message": 1, "interrupt": -signal.SIGINT, "finish": 0}
    out = {action: command.communicate() for action, command in commands.items()}
    for action in actions:
        assert out[action][0].startswith(f"hello {tmp_path} ['{action}']")  # its environment, directory, arguments
    assert "RuntimeError: raised in the child" in out["raise"][1]  # the traceback, as python -m prints it
    assert "a message to the user" in out["message"][1] and "KeyboardInterrupt" in out["interrupt"][1]
    finished = out["finish"][0]
    assert "unflushed line" in finished and "exit handler ran" in finished and "finalizer ran" in finished
    assert finished.index("thread joined") < finished.index("exit handler ran")  # threads first, as Python does


def test_the_interpreter_s_own_end_steps_that_commands_call_are_there():
    # Canary: run_module_and_exit ends a command through CPython's threading._shutdown and atexit._run_exitfuncs; the
    # launcher leaves the finalizers registered before a fork (weakref.finalize._registry) to the teardown it skips.
    import atexit
    import threading
    import weakref

    assert callable(threading._shutdown) and callable(atexit._run_exitfuncs)
    kept = type("Kept", (), {})()
    finalizer = weakref.finalize(kept, print)
    assert finalizer in weakref.finalize._registry
    finalizer.atexit = False
    assert not finalizer.atexit
    finalizer.detach()
