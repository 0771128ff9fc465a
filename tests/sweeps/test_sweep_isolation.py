"""A local sweep's trials are forked from a warm launcher (scripts/sweeps/launcher.py) and stay processes of their own:
a trial that dies of a signal or hangs fails alone, the study goes on; the launcher itself, driven directly, gives
each child its own exit status, output, environment and working directory."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest
import yaml
from mlflow import MlflowClient

from scripts.sweeps.launcher import Launcher
from tests import warm_launcher
from tests.conftest import REPO, run_module

pytestmark = pytest.mark.slow  # sweeps train; the launcher imports torch, Lightning and MLflow
LR = "model.optimizer.init_args.lr"


def processes_with(marker: str) -> list[int]:
    """Pids of the live processes whose environment holds `marker` (this test's sweep, its launcher, its trials)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            try:
                if marker.encode() in (entry / "environ").read_bytes():
                    found.append(int(entry.name))
            except OSError:
                pass
    return found


def test_a_trial_that_dies_of_a_signal_and_one_that_hangs_fail_alone_and_the_study_goes_on(tmp_path):
    # Trial n trains with seed 7 + n: trial 0 aborts (SIGABRT), trial 1 hangs deaf to SIGTERM until the sweep kills it
    # after budget.trial_time, trial 2 trains. The objective check's short fit (seed 42) meets neither. trial_time 15 s:
    # a forked 2-epoch trial takes a few seconds on loaded cores; the deaf one costs it plus the sweep's 30 s grace.
    faults = tmp_path / "faults.yaml"
    fault = {"class_path": "tests.sweeps.sweep_callbacks.Fault", "init_args": {"abort_seed": 7, "hang_seed": 8}}
    faults.write_text(yaml.safe_dump({"trainer": {"callbacks": [fault]}}))
    path = tmp_path / "faults-test.yaml"
    path.write_text(
        yaml.safe_dump({
            "config": ["configs/penguins.yaml", str(faults)],
            "objective": {"metric": "val_loss", "goal": "minimize"},
            "sampling": {"algorithm": "random", "seed": 7},
            "budget": {"trials": 3, "trial_time": 15},
            "fixed": {"trainer.max_epochs": 2, "model.optimizer.class_path": "torch.optim.SGD"},
            "search_space": {LR: {"loguniform": [0.05, 0.5]}},
        })
    )  # fmt: skip
    outputs = tmp_path / "outputs"
    marker = f"SWEEP_ISOLATION_TEST={tmp_path}"
    env = {key: value for key, value in os.environ.items() if not key.startswith("MLFLOW_")}
    env["SWEEP_ISOLATION_TEST"] = str(tmp_path)
    result = run_module("scripts.sweep", str(path), "--outputs", str(outputs), env=env)

    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]  # the study has a best trial
    lines = [line for line in result.stdout.splitlines() if line.startswith("trial ")]
    assert len(lines) == 3, result.stdout
    assert " FAIL " in lines[0] and "the fit died of SIGABRT (exit -6)" in lines[0], lines[0]
    assert " FAIL " in lines[1] and "ran past budget.trial_time (15 s)" in lines[1], lines[1]
    assert " COMPLETE " in lines[2], lines[2]
    assert "3 trials: 1 complete, 2 fail" in result.stdout
    assert "best trial 2:" in result.stdout and (outputs / "sweeps" / "faults-test" / "best.yaml").is_file()
    assert processes_with(marker) == []  # the hung trial was killed, the launcher ended with the sweep

    study = optuna.load_study(study_name="faults-test", storage=f"sqlite:///{outputs}/sweeps/optuna.db")
    assert [trial.state.name for trial in study.trials] == ["FAIL", "FAIL", "COMPLETE"]
    client = MlflowClient(f"sqlite:///{outputs}/mlflow.db")
    runs = [client.get_run(trial.user_attrs["mlflow_run_id"]) for trial in study.trials]
    assert [(run.info.status, run.data.tags["sweep.state"]) for run in runs] == [
        ("FAILED", "FAIL"), ("FAILED", "FAIL"), ("FINISHED", "COMPLETE"),
    ]  # fmt: skip
    parent = {run.data.tags["mlflow.parentRunId"] for run in runs}
    assert len(parent) == 1 and client.get_run(parent.pop()).info.status == "FINISHED"


def test_the_launcher_runs_each_child_as_python_m_would_in_a_process_of_its_own(tmp_path):
    # A module the launcher imports before it forks registers a finalizer: the launcher's, not the children's.
    (tmp_path / "preloaded.py").write_text(
        "import weakref\nclass Kept: pass\nkept = Kept()\nweakref.finalize(kept, print, 'launcher finalizer ran')\n"
    )
    launcher = Launcher({**os.environ, "PYTHONPATH": f"{tmp_path}:{REPO}"}, ["preloaded"])
    try:
        log = tmp_path / "child.log"
        env = {**os.environ, "LAUNCHED_SAYS": "hello"}
        script = tmp_path / "program.py"
        script.write_text(
            "import os, sys, time\n"
            "print(os.environ['LAUNCHED_SAYS'], os.getcwd(), sys.argv[1:], flush=True)\n"
            "action = sys.argv[1]\n"
            "if action == 'exit': sys.exit(3)\n"
            "if action == 'raise': raise RuntimeError('raised in the child')\n"
            "if action == 'abort': os.abort()\n"
            "if action == 'sleep':\n"
            "    while True: time.sleep(1)\n"
            "if action == 'message': sys.exit('a message to the user')\n"
            "if action == 'interrupt': raise KeyboardInterrupt\n"
            "if action == 'finish':\n"  # what the interpreter's end does: join threads, run exit handlers, flush
            "    import atexit, threading, weakref\n"
            "    atexit.register(lambda: print('exit handler ran'))\n"
            "    class Kept: pass\n"
            "    kept = Kept()\n"
            "    weakref.finalize(kept, print, 'child finalizer ran')\n"
            "    threading.Thread(target=lambda: (time.sleep(1), print('thread joined'))).start()\n"
            "    print('unflushed line', end='')\n"
        )
        os.chdir(tmp_path)  # the child takes the working directory of the one who asks
        try:
            actions = ("exit", "raise", "sleep", "message", "interrupt", "finish")
            children = {action: launcher.start(0, "program", [action], env, log) for action in actions}
        finally:
            os.chdir(REPO)
        assert children["exit"].wait(timeout=120) == 3
        assert children["raise"].wait(timeout=120) == 1
        assert children["message"].wait(timeout=120) == 1
        assert children["interrupt"].wait(timeout=120) == -signal.SIGINT  # as python -m ends on an uncaught Ctrl-C
        assert children["finish"].wait(timeout=120) == 0
        sleeping = children["sleep"]
        with pytest.raises(subprocess.TimeoutExpired):
            sleeping.wait(timeout=1)
        assert os.getsid(sleeping.pid) == sleeping.pid  # a session of its own: a Ctrl-C in the terminal misses it
        sleeping.kill()
        assert sleeping.wait(timeout=60) == -signal.SIGKILL
        text = log.read_text()
        for action in ("exit", "raise", "sleep"):
            assert f"hello {tmp_path} ['{action}']" in text  # its environment, directory and arguments
        assert "RuntimeError: raised in the child" in text  # the traceback, as python -m prints it
        assert "a message to the user" in text and "KeyboardInterrupt" in text
        assert "unflushed line" in text and "thread joined" in text and "exit handler ran" in text
        assert "child finalizer ran" in text and "launcher finalizer ran" not in text  # its own, not its launcher's
        assert text.index("thread joined") < text.index("exit handler ran")  # threads first, as the interpreter does
        assert launcher.process.poll() is None  # the launcher goes on after its children's ends
    finally:
        launcher.close()


def test_a_sweep_forks_its_launcher_from_itself_and_a_launcher_that_died_is_started_fresh(tmp_path):
    """A sweep's process (one thread, the launcher's environment but MLflow's run variables) imports what the launcher
    preloads and forks it, instead of a second interpreter importing them again; once it runs threads (after a
    launcher died) the next launcher is `python -m scripts.sweeps.launcher`. Each gives its trials their own session,
    environment and exit status, the preloaded libraries imported."""
    (tmp_path / "probe.py").write_text(
        "import os, sys\n"
        "print(os.getppid(), os.getsid(0) == os.getpid(), 'torch' in sys.modules, os.environ['PROBE'])\n"
        "sys.exit(int(os.environ['PROBE']))\n"
    )
    (tmp_path / "driver.py").write_text(
        "import os, signal\n"
        "from pathlib import Path\n"
        "from scripts.sweeps.launcher import Launcher\n"
        "launcher = Launcher({key: value for key, value in os.environ.items() if key != 'MLFLOW_RUN_ID'})\n"
        "for number in (3, 4):\n"
        "    log = Path(f'probe-{number}.log')\n"
        "    child = launcher.start(number, 'probe', [], {**os.environ, 'PROBE': str(number)}, log)\n"
        "    status = child.wait(timeout=120)\n"
        "    print(type(launcher.process).__name__, launcher.process.pid, status, log.read_text().strip())\n"
        "    os.kill(launcher.process.pid, signal.SIGKILL)\n"
        "    launcher.process.wait()\n"
    )
    # A fresh interpreter, as a sweep is, whose MLflow run variable its launcher does not take.
    env = {**os.environ, "PYTHONPATH": str(REPO), "MLFLOW_RUN_ID": "the sweep's own"}
    result = subprocess.run([sys.executable, "driver.py"], cwd=tmp_path, env=env, capture_output=True, text=True,
                            timeout=600)  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    forked, fresh = [line.split() for line in result.stdout.splitlines()]
    assert forked[0] == "ForkedLauncher" and fresh[0] == "Popen", result.stdout
    for (_, launcher_pid, status, parent, own_session, preloaded, probe), number in zip((forked, fresh), ("3", "4")):
        assert parent == launcher_pid and status == probe == number
        assert own_session == preloaded == "True"


def test_a_trial_parses_its_command_as_if_nothing_were_parsed_before_though_its_launcher_parsed_the_sweeps(tmp_path):
    # The launcher parses a trial's command with the sweep's first values before it forks (scripts.sweep's
    # parsed_ahead): jsonargparse keeps the parsers of the classes named. A trial's own command, other classes and
    # values, a callback appended with `+`, prints the config that `python -m scripts.train` prints for it in a process
    # that has parsed nothing.
    from scripts.sweep import parsed_ahead
    from scripts.sweeps.space import load_sweep

    ahead = parsed_ahead(load_sweep("configs/sweeps/penguins.yaml"))
    callback = ('{"class_path": "scripts.sweeps.trial.SweepTrial", "init_args": {"storage": "sqlite:///x.db", '
                '"study_name": "s", "sweep_file": "configs/sweeps/penguins.yaml", "metric": "val_acc"}}')  # fmt: skip
    trial = ["fit", "--config", "configs/penguins.yaml", "--model.optimizer.class_path", "torch.optim.SGD",
             "--model.optimizer.init_args.lr", "0.05", "--data.init_args.batch_size", "40",
             "--model.network.init_args.hidden", "7", "--data.init_args.preprocessing", "standardize",
             "--seed_everything", "49", "--trainer.callbacks+", callback, "--print_config"]  # fmt: skip
    program = tmp_path / "trial_parse.py"
    program.write_text(
        "import sys, jsonargparse._typehints as typehints\n"
        "print(len(typehints._cached_class_parsers), file=sys.stderr)\n"  # what the launcher's parse left
        "from scripts.train import main\n"
        "main()\n"
    )
    launcher = Launcher({**os.environ, "PYTHONPATH": f"{tmp_path}:{REPO}"}, command=ahead)
    try:
        log = tmp_path / "trial.log"
        child = launcher.start(0, "trial_parse", trial, {**os.environ, "PYTHONPATH": f"{tmp_path}:{REPO}"}, log)
        assert child.wait(timeout=300) == 0, log.read_text()[-3000:]
    finally:
        launcher.close()
    fresh = warm_launcher.run("scripts.train", trial, REPO)  # forked from a process that has parsed nothing
    assert fresh.returncode == 0, fresh.stderr[-3000:]
    cached, printed = log.read_text().split("\n", 1)
    assert int(cached) >= 5  # the module's, the network's, the optimizer's, the datamodule's, the callbacks' parsers
    assert printed == fresh.stdout
    config = yaml.safe_load(printed)
    assert config["model"]["optimizer"]["class_path"] == "torch.optim.SGD" and config["seed_everything"] == 49
    callbacks = [callback["class_path"].rsplit(".", 1)[-1] for callback in config["trainer"]["callbacks"]]
    assert callbacks == ["EarlyStopping", "SweepTrial"]


def test_the_interpreter_s_own_end_steps_that_children_call_are_there():
    # Canary: run_module_and_exit ends a child through CPython's threading._shutdown and atexit._run_exitfuncs; the
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


def test_a_child_sees_its_launcher_gone_when_the_sweep_is(tmp_path):
    # The sweep killed outright (SIGKILL) closes the launcher's pipe: the launcher ends and its running children are
    # orphans, which scripts.sweeps.trial.SweepTrial notices (os.getppid() changes) and stops.
    script = tmp_path / "orphan.py"
    out = tmp_path / "parents.txt"
    script.write_text(
        "import os, time\n"
        "first = os.getppid()\n"
        "while os.getppid() == first: time.sleep(0.2)\n"
        f"open({str(out)!r} + '.part', 'w').write(f'{{first}} {{os.getppid()}}')\n"
        f"os.replace({str(out)!r} + '.part', {str(out)!r})\n"  # whole or absent: the test polls for it
    )
    driver = tmp_path / "driver.py"
    driver.write_text(
        "import os, sys, time\n"
        "from pathlib import Path\n"
        "from scripts.sweeps.launcher import Launcher\n"
        f"launcher = Launcher({{**os.environ, 'PYTHONPATH': {str(tmp_path)!r}}})\n"
        f"child = launcher.start(0, 'orphan', [], dict(os.environ), Path({str(tmp_path / 'o.log')!r}))\n"
        "print(launcher.process.pid, child.pid, flush=True)\n"
        "time.sleep(600)\n"
    )
    process = subprocess.Popen([sys.executable, str(driver)], cwd=REPO, stdout=subprocess.PIPE, text=True,
                               env={**os.environ, "PYTHONPATH": str(REPO)})  # fmt: skip
    launcher_pid, child_pid = map(int, process.stdout.readline().split())
    process.kill()
    process.wait()
    deadline = time.monotonic() + 60
    while not out.is_file() and time.monotonic() < deadline:
        time.sleep(0.2)
    first, now = map(int, out.read_text().split())
    assert first == launcher_pid and now != launcher_pid
