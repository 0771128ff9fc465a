"""A local sweep's Optuna study: its database (sqlite here, or a server's that processes on several machines share),
created or resumed only with the same configs, objective and search space, its sampler, and best.yaml, the config of
its best finished trial.

    python -m scripts.sweep configs/sweeps/penguins.yaml --study_name penguins-2 --storage postgresql://host/optuna
"""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path
from typing import TYPE_CHECKING

import yaml

from scripts.sweeps.runner import HOST, PID
from scripts.sweeps.space import Sweep, SweepError

if TYPE_CHECKING:
    from scripts.sweeps.runner import Runner

PARENT_RUN_ID, FINGERPRINT, STARTS = "mlflow_parent_run_id", "sweep_file", "starts"  # study user attributes
OWNER = "database"  # in the study's folder: the digest of the database whose study its trials are (database_of)


def nested(values: dict) -> dict:
    """{'model.optimizer.init_args.lr': 0.1} -> {'model': {'optimizer': {'init_args': {'lr': 0.1}}}}."""
    tree: dict = {}
    for option, value in values.items():
        *parents, leaf = option.split(".")
        node = tree
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    return tree


def make_sampler(sweep: Sweep, seed: int):
    import optuna

    if sweep.algorithm == "grid":
        return optuna.samplers.GridSampler({p.option: p.grid_values() for p in sweep.params}, seed=seed)
    if sweep.algorithm == "bayesian":
        return optuna.samplers.TPESampler(seed=seed)
    return optuna.samplers.RandomSampler(seed=seed)


def connect(storage_url: str):
    """The study database (with the sweep processes' heartbeat), or one line saying why it cannot be opened.

    Optuna creates a new sqlite database's tables and stamps their version unguarded: another opener at the same
    moment (a second sweep process on the same new study, optuna-dashboard, optuna.load_study) makes this one fail
    ("table studies already exists", "UNIQUE constraint failed: alembic_version.version_num"). The tables are then
    there, or nearly: the sweep opens the database again until they are."""
    from scripts.sweeps.trial import open_storage

    deadline = time.monotonic() + 60  # as long as sqlite waits for a lock (open_storage)
    while True:
        try:
            return open_storage(storage_url, heartbeat=True)
        except Exception as error:  # no such server, no driver for its scheme (postgresql needs psycopg2), a bad URL
            first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
            created_meanwhile = any(words in first for words in ("already exists", "UNIQUE constraint failed"))
            if storage_url.startswith("sqlite") and created_meanwhile and time.monotonic() < deadline:
                time.sleep(0.1)
                continue
            raise SweepError(f"--storage {storage_url}: cannot open the study's database ({first})") from None


def database_of(url: str) -> str:
    """Which database a storage URL names, as a digest (a server's URL may hold a password): a sqlite file by its
    absolute path, however the URL spells it."""
    if url.startswith("sqlite:///"):
        url = f"sqlite:///{Path(url.removeprefix('sqlite:///')).resolve()}"
    return hashlib.sha256(url.encode()).hexdigest()


def open_study(sweep: Sweep, study_name: str, storage, folder: Path):
    """Creates the study in `storage` or loads it (same config, objective and search space only), with the sweep's
    sampler, seeded anew at each start, and its pruner."""
    import optuna
    from filelock import FileLock

    from scripts.sweeps.trial import make_pruner

    with FileLock(str(folder / "study.lock")):
        # The folder's trials (their logs, checkpoints, best.yaml) are one database's study's: another database's
        # study of this name would take trial-0... for its own, deleting the others.
        owner, database = folder / OWNER, database_of(storage.url)
        if owner.is_file() and owner.read_text().strip() != database:
            raise SweepError(
                f"{sweep.path}: {folder} holds the trials of study {study_name} of another database than "
                f"{storage.url}; give --study_name NEW (or --outputs another folder) to keep them"
            )
        study = optuna.create_study(study_name=study_name, storage=storage, direction=sweep.goal, load_if_exists=True)
        fingerprint = json.loads(json.dumps(sweep.fingerprint(), sort_keys=True))  # as stored: lists, str keys
        given = study.user_attrs.get(FINGERPRINT)
        before = json.loads(given) if given is not None else None
        if before is not None:
            # A study started before config files were fingerprinted by their contents has no "contents" (nor
            # "nested", before the files they point to were).
            now = {key: value for key, value in fingerprint.items() if key in before}
            if now != before:
                raise SweepError(changed_since(sweep, study_name, storage.url, before, now))
        if before is None or before.keys() != fingerprint.keys():
            study.set_user_attr(FINGERPRINT, json.dumps(fingerprint, sort_keys=True))
        starts = study.user_attrs.get(STARTS, 0)
        study.set_user_attr(STARTS, starts + 1)
        owner.write_text(database + "\n")
    # Each start draws other values: a resumed or second process must not repeat the first's draws.
    seed = sweep.seed + 7919 * starts
    study = optuna.load_study(
        study_name=study_name, storage=storage, sampler=make_sampler(sweep, seed), pruner=make_pruner(sweep.termination)
    )
    return study


def changed_since(sweep: Sweep, study_name: str, url: str, before: dict, now: dict) -> str:
    """Why a study cannot be resumed from this file: a config file edited since it started is named (its trials
    trained on the file as it was, the next ones would train on it as it is, and best.yaml goes with the file)."""
    files = ("contents", "nested")  # digests of the configs, then of the config files they point to
    rest = [key for key in now if key not in files and now[key] != before[key]]
    edited = [path for key in files for path, digest in before.get(key, {}).items() if now[key].get(path) != digest]
    if edited and not rest:
        return (
            f"{sweep.path}: {edited[0]} changed since study {study_name} in {url} started (its trials trained on it "
            f"as it was); restore it, or give --study_name NEW for a new study"
        )
    return (
        f"{sweep.path}: study {study_name} in {url} was started with another config, objective or search space; give "
        f"--study_name NEW for a new study (or delete that study to start over)"
    )


def write_best(runner: Runner, best, finished: int, running: list) -> Path:
    """best.yaml: the best finished trial's values, the fixed options and its seed, as a config to add after the
    task's; its header says which trials of the study were still running (in other processes) when it was written."""
    sweep = runner.sweep
    original = best.system_attrs.get("failed_trial", best.number)
    values = {"seed_everything": sweep.seed + original, **sweep.fixed, **best.params}
    configs = " ".join(f"--config {config}" for config in sweep.configs)
    path = runner.folder / "best.yaml"
    header = (
        f"# Best trial {best.number} of sweep {runner.study.study_name} ({sweep.path}): {sweep.metric} "
        f"{best.value:.4f} ({sweep.goal}), the best of {finished} finished trial{'s' * (finished != 1)}.\n"
    )
    if running:
        header += f"# Still running when this was written: {still_running(running)}; the last sweep process to end "
        header += "writes this file again.\n"
    header += f"#   python -m scripts.train fit {configs} --config {path}\n"
    path.write_text(header + yaml.safe_dump(nested(values), sort_keys=False))
    return path


def still_running(running: list) -> str:
    """'trial 3 (process 123 on host-a)' for each trial still running in another process, by commas."""
    return ", ".join(f"trial {t.number} (process {t.user_attrs.get(PID)} on {t.user_attrs.get(HOST)})" for t in running)
