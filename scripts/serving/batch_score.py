"""The scoring script of an Azure ML batch deployment of image files (scripts.deploy batch --inputs images): the
registered MLflow model, unchanged, over each mini-batch of files Azure ML hands it; CSV and Parquet files of rows are
scored too (one output row per row). Azure ML calls init() once per process, then run(mini_batch) with a list of file
paths, and appends the rows run returns to predictions.csv. Locally, on a folder or a CSV:

    python -m scripts.serving.batch_score MODEL_DIR FILE_OR_FOLDER...

Self-contained (the model, pandas and MLflow), as Azure ML's batch driver loads it by path; the one file of this
project it reads, datamodules/preprocessing/images.py (which files are no one's data), it loads by its path. A file
or a table's row the model refuses is logged and left out, the rest scored (docs/azure-ml.md, batch endpoints).
"""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path

import pandas as pd

TABLES = {".csv": pd.read_csv, ".parquet": pd.read_parquet}
log = logging.getLogger("batch_score")
model = None


def model_folder(root: str) -> str:
    """The folder holding MLmodel: AZUREML_MODEL_DIR itself or the one folder below it (Azure ML mounts a registered
    MLflow model under its artifact path)."""
    found = sorted(Path(root).glob("MLmodel")) or sorted(Path(root).glob("*/MLmodel"))
    if not found:
        raise FileNotFoundError(f"{root}: no MLmodel here or one folder below; deploy an MLflow model")
    return str(found[0].parent)


def init(model_dir: str | None = None) -> None:
    import mlflow

    global model
    model = mlflow.pyfunc.load_model(model_folder(model_dir or os.environ["AZUREML_MODEL_DIR"]))


def parquet_unreadable(path: str) -> str | None:
    """Why the Parquet file `path` cannot be read here (no pyarrow), or None."""
    import importlib

    for engine in ("pyarrow", "fastparquet"):  # pandas' engines
        try:
            importlib.import_module(engine)
            return None
        except ImportError:
            pass
    return (f"{path}: reading a Parquet file needs pyarrow, which this Python environment lacks; install it (pip "
            "install pyarrow==25.0.1) or give the rows as a CSV file")  # fmt: skip


def score_file(path: str) -> pd.DataFrame:
    """One file's predictions, each row led by the file's name (and the row's number in a table)."""
    read = TABLES.get(Path(path).suffix.lower())
    if read is pd.read_parquet and (reason := parquet_unreadable(path)):
        raise ValueError(reason.removeprefix(f"{path}: "))  # run() logs it after the file's name
    if read is None:
        inputs = pd.DataFrame({"image": [Path(path).read_bytes()]})
        return pd.concat([pd.DataFrame({"file": [Path(path).name]}), model.predict(inputs)], axis=1)
    rows = complete_rows(read(path), path)
    answers = model.predict(rows).reset_index(drop=True)
    return pd.concat([pd.DataFrame({"file": Path(path).name, "row": rows.index}), answers], axis=1)


def fills_missing_cells() -> bool:
    """Whether the model's preprocessing answers rows with empty cells (its state says so)."""
    from mlflow.exceptions import MlflowException

    try:
        state = getattr(model.unwrap_python_model(), "state", None) or {}
    except MlflowException:  # a model of another flavour than a python_function model
        return False
    return bool(state.get("fills_missing_cells"))


def complete_rows(rows: pd.DataFrame, path: str) -> pd.DataFrame:
    """The table's rows with a value in every column the model reads (its signature's), indexed by their row in the
    file; each other row is logged by its row, in predict's words, and left out: the rest are answered, as predict
    answers a CSV's complete rows. A model whose preprocessing fills empty cells by a policy (the table task's: its
    state's `fills_missing_cells`) is given every row."""
    if fills_missing_cells():
        return rows
    schema = model.metadata.get_input_schema()
    names = set(schema.input_names()) if schema is not None and schema.has_input_names() else set(rows.columns)
    read = [column for column in rows.columns if column in names]
    gaps = rows[read].isna()
    lacking = gaps.any(axis=1).to_numpy()
    for index in rows.index[lacking]:
        missing = ", ".join(column for column in read if gaps.loc[index, column])
        log.warning("%s: row %d (from 0, as the output's) has no %s: skipped, no answer for it", path, index, missing)
    if lacking.all() and len(rows):
        raise ValueError(f"no row has all of {', '.join(read)}; fill in the empty cells")
    return rows[~lacking]


def ignored(path: str) -> bool:
    """Whether the file's name is no one's data (datamodules/preprocessing/images.py, loaded by its path: the package
    `datamodules` it imports DataError from is the loaded model's own copy)."""
    import importlib.util

    name = "_batch_score_images"
    if name not in sys.modules:
        source = Path(__file__).resolve().parents[2] / "datamodules" / "preprocessing" / "images.py"
        spec = importlib.util.spec_from_file_location(name, source)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        sys.modules[name] = module
    return sys.modules[name].ignored(Path(path).name)


def run(mini_batch: list[str]) -> pd.DataFrame:
    """The predictions of the mini-batch's files, one row per image or table row; a file that fails is logged. Files
    that are no one's data (`ignored`) are left out without a word."""
    mini_batch = [path for path in mini_batch if not ignored(path)]
    images = [path for path in mini_batch if Path(path).suffix.lower() not in TABLES]
    scored: dict[str, pd.DataFrame] = {}
    if len(images) > 1:  # one predict for the images; if one of them fails, each again on its own
        try:
            inputs = pd.DataFrame({"image": [Path(path).read_bytes() for path in images]})
            answers = model.predict(inputs).reset_index(drop=True)
            names = pd.DataFrame({"file": [Path(path).name for path in images]})
            for index, path in enumerate(images):
                scored[path] = pd.concat([names.iloc[[index]], answers.iloc[[index]]], axis=1)
        except Exception:
            scored = {}
    for path in mini_batch:
        if path not in scored:
            try:
                scored[path] = score_file(path)
            except Exception as error:
                log.error("%s: %s", path, str(error).strip().splitlines()[0] if str(error).strip() else error)
    if not scored:
        return pd.DataFrame()
    frames = [scored[path] for path in mini_batch if path in scored]
    return pd.concat([frame.reset_index(drop=True) for frame in frames], ignore_index=True)


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    usage = "usage: python -m scripts.serving.batch_score MODEL_DIR FILE_OR_FOLDER...  (prints the predictions as CSV)"
    if argv[:1] in (["-h"], ["--help"]):
        print(usage)
        return
    if len(argv) < 2:
        sys.exit(usage)
    missing = [given for given in argv[1:] if not Path(given).exists()]
    if missing:
        sys.exit(f"error: {missing[0]}: no such file or folder; give files or folders to score after MODEL_DIR")
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    from scripts.serving.csv_output import csv_text  # before the model's code_paths (its own datamodules) come first

    files = [str(p) for given in argv[1:] for p in (sorted(Path(given).iterdir()) if Path(given).is_dir() else [given])]
    parquet = [path for path in files if TABLES.get(Path(path).suffix.lower()) is pd.read_parquet]
    if parquet and (reason := parquet_unreadable(parquet[0])):
        sys.exit(f"error: {reason}")
    try:
        init(argv[0])
    except FileNotFoundError as error:  # model_folder's one line
        sys.exit(f"error: {error}")
    answers = run(files)
    # As predict writes its CSV: a name's carriage return quoted, bytes that are not UTF-8 as \xNN (pandas' CSV left
    # the one bare, splitting the row, and crashed on the other). An empty cell (a table's row of an image) stays empty.
    cells = answers.astype(object).where(answers.notna(), "")
    sys.stdout.write(csv_text([answers.columns, *cells.itertuples(index=False)]))


if __name__ == "__main__":
    main()
