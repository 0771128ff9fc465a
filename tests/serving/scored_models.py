"""Trained models, saved as `fit --register_model` registers them, with what `scripts.train predict` answers for their
inputs: the reference that the batch deployment's scoring script (tests/serving/test_batch_score.py) and Spark's
spark_udf (tests/spark/test_spark.py) are held to. One fit per task a test session, shared by both modules (a fixture
imported into two modules is two fixtures to pytest: the models are kept here).

    models = scored_models(tmp_path_factory)  # in a test module's fixture
"""

from __future__ import annotations

import fcntl
import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path

from tests.conftest import bird_folders
from tests.serving.test_serve import TINY, fit, predictions


@dataclass
class Scored:
    model: Path  # the MLflow model folder
    inputs: Path  # penguins: a CSV of rows with their species; birds: a folder of photos in folders named by class
    expected: dict[str, tuple[str, float]]  # scripts.train predict: input -> (class, probability)


SCORED: dict[str, Scored] = {}


def scored_models(tmp_path_factory) -> dict[str, Scored]:
    """The models, fitted by the first process of the test run that asks (`make test`'s xdist workers run the two
    modules apart) and read by the others from a record in the folder they all see (tests/conftest.py)."""
    if not SCORED:
        shared = Path(os.environ["TESTS_SHARED_DIR"])
        with open(shared / "scored-models.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
            record = shared / "scored-models.json"
            if not record.is_file():
                fitted = fit_and_predict(tmp_path_factory)
                record.write_text(json.dumps({task: asdict(scored) for task, scored in fitted.items()}, default=str))
            found = json.loads(record.read_text())
        for task, scored in found.items():
            expected = {name: tuple(answer) for name, answer in scored["expected"].items()}
            SCORED[task] = Scored(Path(scored["model"]), Path(scored["inputs"]), expected)
    return SCORED


def fit_and_predict(tmp_path_factory) -> dict[str, Scored]:
    from palmerpenguins import load_penguins

    from scripts.serve import from_checkpoint

    folder = tmp_path_factory.mktemp("scored-models")
    best, _ = fit(folder / "penguins-outputs", "--config", "configs/penguins.yaml", "--trainer.max_epochs", "4")
    rows = load_penguins().drop(columns=["sex", "year"]).dropna().iloc[::5]  # 69 rows of the three species
    rows.to_csv(folder / "penguins.csv", index=False)
    penguins = Scored(
        from_checkpoint(best, folder / "penguins"),
        folder / "penguins.csv",
        predictions("--config", "configs/penguins.yaml", "--ckpt_path", str(best),
                    "--data.predict_path", str(folder / "penguins.csv")),
    )  # fmt: skip
    data = bird_folders(folder / "birds-data", count=4)
    options = ("--data.init_args.image_size", "64", "--data.init_args.num_workers", "0")
    best, _ = fit(folder / "birds-outputs", "--config", "configs/birds.yaml", "--data.init_args.data_dir", str(data),
                  "--data.init_args.archive", "null", "--data.init_args.batch_size", "4", *options, *TINY)  # fmt: skip
    expected = {}
    for name in ("chickens", "turkeys"):  # predict reads a flat folder: one call per class folder
        expected |= predictions("--config", "configs/birds.yaml", "--ckpt_path", str(best), "--data.predict_path",
                                str(data / "val" / name), *options)  # fmt: skip
    birds = Scored(from_checkpoint(best, folder / "birds"), data / "val", expected)
    return {"penguins": penguins, "birds": birds}
