"""An empty MLflow store, made once per test process by MLflow itself, copied to where a test's command would make
its new one: MLflow makes a new sqlite store by running its migrations, ~1.1 s of CPU a store (docs/measured.md),
which the suite's hundreds of fits in fresh folders would each pay. The product makes its stores itself
(scripts/training/tracking.py open_sqlite_store), as the tests that start their processes themselves
(tests/test_core.py, Spark's, mpirun's and torchrun's) see it do; TESTS_FRESH_STORES=1 turns the copies off.

A copy goes only to a `fit`, `validate` or `test` with `--trainer.default_root_dir` (the folder whose mlflow.db a
fit makes), no tracking URI of its own, and no store there yet. When the command ends, a copy it never opened (no
lock file of the product's beside it: a refusal before the run, as every bad-input test is) is removed with the
folders made for it, so the folder holds what the product left in it.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import threading
from pathlib import Path

_template: Path | None = None
_lock = threading.Lock()


def template() -> Path:
    """This process's empty store, made by MLflow the first time one is asked for."""
    global _template
    with _lock:
        if _template is None:
            from mlflow import MlflowClient

            path = Path(tempfile.mkdtemp(prefix="seeded-store-")) / "mlflow.db"
            MlflowClient(f"sqlite:///{path}").search_experiments(max_results=1)
            _template = path
        return _template


def seed(args: list[str], cwd: str | Path, env: dict[str, str]) -> tuple[Path, list[Path]] | None:
    """The store copied for this command and the folders made for it (None where it makes none, or has one)."""
    if os.environ.get("TESTS_FRESH_STORES") or env.get("MLFLOW_TRACKING_URI"):
        return None
    if any(arg.startswith("--trainer.logger") for arg in args) or "--trainer.default_root_dir" not in args:
        return None
    index = args.index("--trainer.default_root_dir")
    if index + 1 >= len(args) or args[0] not in ("fit", "validate", "test"):
        return None
    store = Path(cwd, args[index + 1]) / "mlflow.db"
    if store.exists() or lock_of(store).exists():
        return None
    made = [folder for folder in (store.parent, *store.parent.parents) if not folder.exists()]
    store.parent.mkdir(parents=True, exist_ok=True)
    partial = store.with_name(f".mlflow.db.{os.getpid()}.seeding")
    shutil.copyfile(template(), partial)
    partial.rename(store)
    return store, made


def lock_of(store: Path) -> Path:
    """The file lock the product takes to open the store (tracking.open_sqlite_store): it is left behind."""
    return store.with_name(store.name + ".lock")


def unseed_if_unopened(seeded: tuple[Path, list[Path]] | None) -> None:
    """Removes a copied store the command never opened (no lock file of the product's beside it), and the folders
    made for it: the folder then holds what the product made."""
    if seeded is None:
        return
    store, made = seeded
    if lock_of(store).exists() or not store.exists():
        return
    store.unlink()
    for folder in made:  # innermost first
        try:
            folder.rmdir()
        except OSError:  # the command put something else there
            return
