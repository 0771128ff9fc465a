"""Spark DataFrames in and out (scripts/spark/dataframes.py), as the Synapse Horovod tutorial's notebook runs: a
DataFrame split with randomSplit, the table task fitted on its training part by TorchDistributor (two tasks on a
`local-cluster[2,1,1024]` master), the registered model's answers added to the test part with predict_on_spark,
and MulticlassClassificationEvaluator's accuracy of them equal to the fit's own test_acc on the same rows. Penguins,
and MNIST as a table of 784 pixel columns.

    .venv/bin/python -m pytest -q -p no:cacheprovider tests/spark/test_dataframes.py -n 0
"""

from __future__ import annotations

import gzip

import numpy as np
import pandas as pd
import pytest

from tests.conftest import MNIST, needs_mnist
from tests.spark.conftest import needs_java


@pytest.fixture(scope="module")
def spark_environment(tmp_path_factory) -> dict[str, str]:
    """The fits' and the scoring's store, one for the module (the session's processes start with it)."""
    return {"MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path_factory.mktemp('store') / 'mlflow.db'}"}


def synapse_flow(spark, frame: pd.DataFrame, label: str, name: str, folder, *options: str) -> tuple[float, float]:
    """The notebook's steps on `frame`: (the fit's test_acc, the evaluator's accuracy of predict_on_spark's answers on
    the test DataFrame)."""
    from pyspark.ml.evaluation import MulticlassClassificationEvaluator

    from scripts.spark import fit_on_spark, predict_on_spark

    train, test = spark.createDataFrame(frame).randomSplit([0.8, 0.2], seed=1)
    result = fit_on_spark(
        ["fit", "--config", "configs/table.yaml", "--data.init_args.label", label, "--num_processes", "2",
         "--trainer.default_root_dir", str(folder / "outputs"), "--register_model", name, *options],
        dataframe=train, test_dataframe=test, storage=str(folder / "store"),
    )  # fmt: skip
    scored = predict_on_spark(f"models:/{name}/1", test, label=label)
    assert {"prediction", "prediction_index", "probability", "label_index"} <= set(scored.columns)
    evaluator = MulticlassClassificationEvaluator(labelCol="label_index", predictionCol="prediction_index",
                                                  metricName="accuracy")  # fmt: skip
    return result["test_acc"], evaluator.evaluate(scored.select("label_index", "prediction_index"))


@pytest.mark.slow
@needs_java
def test_penguins_from_a_dataframe_fit_then_scored_as_the_fit_tested_them(spark, tmp_path):
    from palmerpenguins import load_penguins

    penguins = load_penguins().drop(columns=["year"])
    test_acc, accuracy = synapse_flow(spark, penguins, "species", "penguins-df", tmp_path, "--trainer.max_epochs", "40")
    assert test_acc >= 0.9
    assert accuracy == pytest.approx(test_acc, abs=1e-6)  # test_acc is a float32


def mnist_table(rows: int) -> pd.DataFrame:
    """The first `rows` MNIST training images as a table: 784 pixel columns and the digit."""
    with (
        gzip.open(MNIST / "train-images-idx3-ubyte.gz") as images,
        gzip.open(MNIST / "train-labels-idx1-ubyte.gz") as labels,
    ):
        pixels = np.frombuffer(images.read(), np.uint8, offset=16)[: rows * 784].reshape(rows, 784)
        digits = np.frombuffer(labels.read(), np.uint8, offset=8)[:rows]
    frame = pd.DataFrame(pixels.astype(np.int32), columns=[f"pixel{i}" for i in range(784)])
    return frame.assign(digit=digits.astype(np.int32))


@pytest.mark.slow
@needs_java
@needs_mnist
def test_mnist_as_a_table_from_a_dataframe_as_the_synapse_notebook(spark, tmp_path):
    test_acc, accuracy = synapse_flow(spark, mnist_table(1200), "digit", "mnist-df", tmp_path, "--trainer.max_epochs",
                                      "8")  # fmt: skip
    assert test_acc >= 0.75
    assert accuracy == pytest.approx(test_acc, abs=1e-6)  # test_acc is a float32
