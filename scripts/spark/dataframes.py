"""Spark DataFrames in and out, as the Databricks and Synapse flows this template replaces start and end: train the
table task on a DataFrame, then add the registered model's answers to another for Spark's evaluators.

    from scripts.spark import fit_on_spark, predict_on_spark
    train, test = spark.createDataFrame(penguins).randomSplit([0.8, 0.2], seed=1)
    result = fit_on_spark(["fit", "--config", "configs/table.yaml", "--data.init_args.label", "species",
                           "--num_processes", "2", "--register_model", "penguins-table"],
                          dataframe=train, test_dataframe=test, storage="/dbfs/tmp/penguins")
    scored = predict_on_spark("models:/penguins-table/1", test)   # + prediction, prediction_index, probability

A DataFrame is written once, as Parquet, to `storage`: a folder every task reads at the same path (DBFS's /dbfs/...,
a mounted share, or this machine's disk on a local master; the default, under the fit's outputs, suits a local
master only), as horovod.spark's Store did. The table task then reads that folder as it reads any Spark Parquet
folder (datamodules/table_sources.py).
"""

from __future__ import annotations

import uuid
from pathlib import Path

from scripts.spark.cluster import SparkFitError

TABLE_TASK = "datamodules.table.TableDataModule"


def storage_folder(storage: str | None, outputs: str | None) -> Path:
    """A new folder for the DataFrames of one fit: under `storage` when given, else under the fit's outputs."""
    base = Path(storage) if storage else Path(outputs or "outputs") / "spark-data"
    return base / uuid.uuid4().hex[:12]


def write_dataframes(frames: dict[str, object], folder: Path) -> dict[str, str]:
    """Each DataFrame written as Parquet to its own folder under `folder`; the option each is given to."""
    paths = {}
    for option, frame in frames.items():
        target = folder / option.rsplit(".", 1)[-1]
        # The driver's Spark writes it; the tasks read it as a local path (file: on this machine, DBFS's fuse).
        frame.write.mode("errorifexists").parquet(target.resolve().as_uri() if not str(target).startswith("/dbfs/")
                                                  else "dbfs:" + str(target).removeprefix("/dbfs"))  # fmt: skip
        paths[option] = str(target)
    return paths


def dataframe_args(args: list[str], config, dataframe, test_dataframe, storage: str | None) -> list[str]:
    """`args` with the table task's csv_path (and test_path) set to where the DataFrames were written."""
    if config.data.class_path != TABLE_TASK:
        raise SparkFitError(
            f"dataframe=: trains the table task ({TABLE_TASK}, configs/table.yaml); the config's data is "
            f"{config.data.class_path}"
        )
    for option in ("--data.init_args.csv_path", "--data.init_args.test_path"):
        if any(arg == option or arg.startswith(option + "=") for arg in args):
            raise SparkFitError(f"{option}: the DataFrame given is the data; leave {option} out")
    frames = {"data.init_args.csv_path": dataframe}
    if test_dataframe is not None:
        frames["data.init_args.test_path"] = test_dataframe
    paths = write_dataframes(frames, storage_folder(storage, config.trainer.default_root_dir))
    return [*args, *(arg for option, path in paths.items() for arg in (f"--{option}", path))]


def predict_on_spark(model_uri: str, dataframe, spark=None, label: str | None = None):
    """`dataframe` with the model's answer for each row: `prediction` (the class's name), `prediction_index` (a
    double, the class's index in the model's classes) and `probability` (the class's), through
    mlflow.pyfunc.spark_udf. With `label` (the column of each row's class), also `label_index`, its double index in
    the same classes: what Spark's MulticlassClassificationEvaluator compares with `prediction_index`."""
    from pyspark.sql import functions as F

    from scripts.training.extras import ExtraMissing, load

    try:
        registry = load("scripts.serving.model_registry", "serving", "predict_on_spark")
        scoring = load("scripts.spark.score", "serving", "predict_on_spark")
    except ExtraMissing as error:
        raise SparkFitError(str(error)) from None
    if model_uri.startswith(registry.REGISTRY_URIS):
        registry.use_store(model_uri)
    answers = {"prediction", "prediction_index", "probability", "label_index"}
    if taken := sorted({name.lower() for name in dataframe.columns} & answers):
        raise SparkFitError(f"the DataFrame has a column {taken[0]!r} that the answer adds; rename it")
    if label is not None and label not in dataframe.columns:
        raise SparkFitError(f"label={label!r}: the DataFrame has no such column (its columns: "
                            f"{', '.join(dataframe.columns)})")  # fmt: skip
    try:
        spark = spark or dataframe.sparkSession
        scored, _, classes = scoring.predict(spark, model_uri, dataframe, "the DataFrame", read_from_path=False)
    except scoring.SparkScoreError as error:
        raise SparkFitError(str(error)) from None
    columns = [F.col(f"`{name}`") for name in dataframe.columns]
    columns += [F.col("class").alias("prediction"),
                scoring.index_of(F.col("class"), classes).alias("prediction_index"), F.col("probability")]  # fmt: skip
    if label is not None:
        columns.append(scoring.index_of(F.trim(F.col(f"`{label}`").cast("string")), classes).alias("label_index"))
    return scored.select(*columns)
