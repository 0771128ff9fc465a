"""Score a CSV of rows or a folder of images with the registered MLflow model on Spark: `mlflow.pyfunc.spark_udf`
over a Spark DataFrame (Databricks, Synapse, a cluster of your own, or this machine), the model unchanged.

    python -m scripts.spark score models:/penguins-classifier/1 new.csv --output predictions/
    python -m scripts.spark score runs:/RUN_ID/model photos/ --output predictions/ --master "local-cluster[2,1,1024]"

A CSV is read with its header, each row one input in the columns the model takes (either penguin schema); a folder
is read with Spark's binaryFile source, every file below it one image (the `image` column the model takes). The
predictions (the input's columns or the image's path, then `class`, `probability` and one `probability_<class>` per
class) are written as CSV to --output, which must not exist yet. When the inputs carry their answer (a CSV's --label
column; images in folders named by class, as the datamodules' image folders are), the accuracy is printed, computed
as the Synapse Horovod tutorial does: MulticlassClassificationEvaluator of the label's index against the predicted
class's.
"""

from __future__ import annotations

import os
import re
import tempfile
from pathlib import Path

from scripts.spark.cluster import URI, SparkFitError, unseen_paths

SPARK_OPTIONS = ("--output", "--label", "--master")
IMAGE_COLUMN = "image"  # the input of the models of images (scripts/serving/pyfunc_model.py)
FAILED_ROW = re.compile(r"^\s*(\w+(?:\.\w+)*(?:Error|Exception)): (.+)$")


class SparkScoreError(Exception):
    """A bad model, input, output or label, or a row the model refuses; the message is the one line to print."""


def read_inputs(spark, path: str):
    """A Spark DataFrame of the inputs: a CSV's rows (header, numbers inferred, the datamodules' missing cells as
    null), or one row per file below a folder, less those no one's data (`ignored` of
    datamodules/preprocessing/images.py): its `path` and its bytes as `image`."""
    from pyspark.sql import functions as F

    if path.lower().endswith(".csv"):
        # A quote doubled inside a quoted value, as pandas and Excel write it (Spark's default escapes with a
        # backslash). Not multiLine: that reads a file in one task, where Spark splits a large one at line ends.
        return spark.read.csv(path, header=True, inferSchema=True, nullValue="NA", escape='"')
    from datamodules.preprocessing.images import WINDOWS_FILES

    files = spark.read.format("binaryFile").option("recursiveFileLookup", "true").load(path)
    # Spark leaves out dot files and _x (__MACOSX/) itself; Windows Explorer's files are left out as training does.
    name = F.lower(F.regexp_extract("path", r"([^/]*)$", 1))
    files = files.filter(~name.isin(*WINDOWS_FILES))
    return files.select("path", F.col("content").alias("image")).orderBy("path")


def model_columns(model_uri: str) -> tuple[list[str], list[str], list[str]]:
    """The model's input and output column names and its class names, from its signature (the classes: the
    `probability_<class>` outputs)."""
    import mlflow

    info = mlflow.models.get_model_info(model_uri)
    outputs = info.signature.outputs.input_names() if info.signature and info.signature.outputs else []
    classes = [name.removeprefix("probability_") for name in outputs if name.startswith("probability_")]
    if not classes:
        raise SparkScoreError(
            f"{model_uri}: no probability_<class> outputs in its signature; give a model registered by "
            "`fit --register_model` (an MLflow pyfunc model of this project)"
        )
    if info.signature.inputs is None:  # a table's model checks its columns itself: its metadata names them
        return list((info.metadata or {}).get("columns") or {}), outputs, classes
    return info.signature.inputs.input_names(), outputs, classes


def model_udf(spark, model_uri: str, outputs: list[str]):
    """The model as a Spark UDF that returns a struct of the model's output columns."""
    import os

    import mlflow

    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")  # the copy spark_udf makes: no bars
    types = ", ".join(f"`{name}` {'string' if name == 'class' else 'double'}" for name in outputs)
    return mlflow.pyfunc.spark_udf(spark, model_uri, result_type=types, env_manager="local")


def model_checks_columns(model_uri: str) -> bool:
    """Whether the model has no input schema and checks its columns itself (a table's model)."""
    import mlflow

    return mlflow.models.get_model_info(model_uri).signature.inputs is None


def check_header(spark, path: str, inputs: list[str]) -> None:
    """A CSV header naming a column the model reads twice: Spark renames the copies (`age0`, `age3`) and the model was
    told of no column `age`, where the other runtimes refuse the name given twice. A CSV on this disk is read here,
    a URI's first line through Spark."""
    line = local_header(path)
    if line is None:
        first = spark.read.text(path).first()
        line = first.value if first else ""
    check_header_line(line, path, inputs)


def check_local_header(model_uri: str, path: str) -> None:
    """check_header of a CSV on this disk before Spark starts: the line comes at once, not after Spark's start (~30 s
    on a local master)."""
    if (line := local_header(path)) is not None:
        check_header_line(line, path, model_columns(model_uri)[0])


def local_header(path: str) -> str | None:
    """The first line of a CSV on this disk; None for anything else (a URI, a folder, another file)."""
    if URI.match(path) or not path.lower().endswith(".csv") or not Path(path).is_file():
        return None
    with open(path, encoding="utf-8", errors="replace", newline="") as file:
        return file.readline().rstrip("\r\n")


def check_header_line(line: str, path: str, inputs: list[str]) -> None:
    import csv

    names = [name.lstrip("\ufeff").strip() for name in next(csv.reader([line]), [])] if line else []
    if twice := next((name for name in names if name in inputs and names.count(name) > 1), None):
        raise SparkScoreError(
            f"{path}: column {twice} is named {names.count(twice)} times in its header; keep one, or rename the others"
        )


def check_kind(path: str, model_uri: str, inputs: list[str]) -> None:
    """A CSV for a model of images, or a folder for a model of rows: the model's own answer would be a pandas repr or
    pyarrow's 'Cannot convert pyarrow.lib.ChunkedArray to pyarrow.lib.Array'."""
    takes_images = inputs == [IMAGE_COLUMN]
    if takes_images and path.lower().endswith(".csv"):
        raise SparkScoreError(f"{path}: the model {model_uri} takes images; give a folder of images")
    if not takes_images and not path.lower().endswith(".csv"):
        raise SparkScoreError(f"{path}: the model {model_uri} takes rows; give a CSV of them (.csv)")


def check_label(frame, path: str, label: str | None) -> None:
    """A --label the inputs cannot have: without it, no accuracy would be printed, and no word said why."""
    if label is None:
        return
    if "path" in frame.columns and "image" in frame.columns:
        raise SparkScoreError(f"--label {label}: images are labelled by the folders they are in; leave --label out")
    if label not in frame.columns:
        raise SparkScoreError(
            f"--label {label}: {path} has no such column (its columns: {', '.join(frame.columns)}); give the column "
            "that holds each row's answer"
        )


def predict(spark, model_uri: str, frame, path: str, read_from_path: bool = True):
    """`frame` with the model's output columns after its own; returns (scored frame, output names, class names).
    `path`: where the frame was read from (read_inputs), or what to call a DataFrame given (read_from_path False)."""
    from pyspark.sql import functions as F

    inputs, outputs, classes = model_columns(model_uri)
    if read_from_path:
        check_kind(path, model_uri, inputs)
    answers = {name.lower() for name in outputs}  # Spark's column names ignore case (spark.sql.caseSensitive)
    if clash := next((name for name in frame.columns if name.lower() in answers), None):
        raise SparkScoreError(
            f"{path}: its column {clash} is also a column of the model's answer ({', '.join(outputs)}); rename it"
        )
    # A header typed "island, bill_length_mm, ..." gives Spark's columns a leading space: the model's names, as the
    # model itself and scripts.score read them.
    given = {name: name.strip() for name in frame.columns if name.strip() in inputs}
    if not given:
        raise SparkScoreError(
            f"{path}: none of its columns ({', '.join(frame.columns)}) is one the model takes ({', '.join(inputs)}); "
            "give a header of the model's column names, separated by commas"
        )
    # Refused as predict, the endpoint and scripts.score refuse it ("scored 0 inputs" looked done), before the model
    # is loaded on the executors: Spark reads one row of the input to tell.
    if frame.isEmpty():
        raise SparkScoreError(nothing_to_score(path))
    if path.lower().endswith(".csv"):
        check_header(spark, path, inputs)
    if model_checks_columns(model_uri):  # every column, as the model is given a CSV's elsewhere: it names the odd ones
        given = {name: name.strip() for name in frame.columns}
    udf = model_udf(spark, model_uri, outputs)
    columns = [F.col(f"`{name}`").alias(stripped) for name, stripped in given.items()]
    scored = frame.withColumn("prediction_struct", udf(F.struct(*columns)))
    scored = scored.select(*frame.columns, *[F.col(f"prediction_struct.`{name}`").alias(name) for name in outputs])
    return scored, outputs, classes


def labelled(scored, classes: list[str], label: str | None):
    """`scored` with double `label` and `prediction` columns (indexes into classes), or None without labels. A label
    is a class's name or its index (the course's penguin CSV: Species 0, 1, 2); images are labelled by their folder."""
    from pyspark.sql import functions as F

    if "path" in scored.columns and label is None:
        given = F.element_at(F.split(F.col("path"), "/"), -2)  # photos/chicken/1.jpg: chicken
    elif label is not None and label in scored.columns:
        given = F.trim(F.col(f"`{label}`").cast("string"))  # " Adelie" is Adelie, as the datamodules read it
    else:
        return None
    index = F.lit(None).cast("double")
    for number, name in reversed(list(enumerate(classes))):
        # An index is read as 1.0 where a cell of its column is empty or written by pandas with one: still class 1.
        index = F.when(given.isin(name, str(number), f"{number}.0"), float(number)).otherwise(index)
    frame = scored.withColumn("label", index).withColumn("given_label", given)
    frame = frame.withColumn("prediction", index_of(F.col("class"), classes))
    if frame.filter(F.col("label").isNotNull()).limit(1).count() == 0:
        if label is not None and scored.limit(1).count():
            raise SparkScoreError(
                f"--label {label}: none of its values is a class of the model ({', '.join(classes)}) or a class's "
                "index; give the column that holds each row's answer"
            )
        return None  # folders not named by class: no accuracy to state
    return frame


def index_of(column, classes: list[str]):
    """The double index of `column`'s value in `classes`; null for none of them."""
    from pyspark.sql import functions as F

    index = F.lit(None).cast("double")
    for number, name in enumerate(classes):
        index = F.when(column == name, float(number)).otherwise(index)
    return index


def accuracy(frame) -> float:
    """The Synapse tutorial's accuracy: MulticlassClassificationEvaluator, label against prediction."""
    from pyspark.ml.evaluation import MulticlassClassificationEvaluator

    evaluator = MulticlassClassificationEvaluator(labelCol="label", predictionCol="prediction", metricName="accuracy")
    # Only the two columns: the evaluator reads a column named `probability` as its vector of class probabilities.
    return evaluator.evaluate(frame.filter(frame.label.isNotNull()).select("label", "prediction"))


def nothing_to_score(path: str) -> str:
    if path.lower().endswith(".csv"):
        return f"{path}: a CSV header and no rows; put one row to score a line below it"
    return f"{path}: no files in it; give a folder of images"


def failure_line(error: Exception) -> str:
    """The model's own message out of the executor's traceback that Spark wraps it in."""
    lines = [FAILED_ROW.match(line) for line in str(error).splitlines()]
    found = [match for match in lines if match and "Traceback" not in match.group(2)]
    if found:
        return f"the model refused an input: {found[-1].group(2).strip()}"
    return f"Spark failed: {str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__}"


def score(spark, model_uri: str, path: str, output: str | None = None, label: str | None = None) -> dict:
    """Scores `path` with the model on `spark`; writes the predictions to `output` (CSV) when given; returns
    {"rows": n, "accuracy": a or None}. Raises SparkScoreError with the line to print."""
    from py4j.protocol import Py4JJavaError
    from pyspark.errors import PySparkException

    try:
        frame = read_inputs(spark, path)
    except PySparkException as error:  # a URI, left to Spark: no such file there, say
        if "PATH_NOT_FOUND" in str(error):
            raise SparkScoreError(
                f"{path}: no such file or folder where Spark reads it; give a CSV of rows or a folder of images"
            ) from None
        raise SparkScoreError(failure_line(error)) from None
    check_label(frame, path, label)
    scored, outputs, classes = predict(spark, model_uri, frame, path)
    try:
        scored = scored.cache()
        rows = scored.count()
        checked = labelled(scored, classes, label)
        result = {"rows": rows, "accuracy": accuracy(checked) if checked is not None else None}
        if output:
            columns = [name for name in scored.columns if name != "image"]
            # A quote in a value (a file's name, a CSV's cell) doubled, not backslashed: Python's csv module and pandas
            # read every value back as it was, commas and line breaks included.
            scored.select(*columns).write.csv(output, header=True, mode="errorifexists", escape='"')
    except (PySparkException, Py4JJavaError) as error:
        raise SparkScoreError(failure_line(error)) from None
    finally:
        scored.unpersist()
    return result


def check_arguments(model_uri: str, path: str, output: str | None) -> None:
    """Mistakes a user can make, before Spark starts."""
    if not URI.match(path) and not Path(path).exists():
        raise SparkScoreError(f"{path}: no such file or folder; give a CSV of rows or a folder of images")
    if not URI.match(path) and Path(path).is_file() and not path.lower().endswith(".csv"):
        raise SparkScoreError(f"{path}: give a CSV of rows (.csv) or a folder of images")
    if output and not URI.match(output) and Path(output).exists():
        raise SparkScoreError(f"--output {output}: already exists; give a new folder (nothing is overwritten)")
    if (
        not re.match(r"^(models|runs|file|dbfs|azureml|s3|gs|abfss?|wasbs?|https?):/", model_uri)
        and not (Path(model_uri) / "MLmodel").is_file()
    ):
        raise SparkScoreError(
            f"model {model_uri!r}: give an MLflow model: models:/NAME/VERSION, runs:/RUN_ID/model or a folder with "
            "an MLmodel file"
        )


def check_score_paths(spark, path: str, output: str | None) -> None:
    """Refuses a scoring input or --output of this disk that the executors do not see: Spark reads the input and
    writes the predictions where its tasks run. The --output's folder (or the nearest one of it there) is asked for by a
    file put there a moment."""

    def local(given: str) -> str | None:
        return re.sub(r"^file:(//)?", "", given) if given.startswith("file:") or not URI.match(given) else None

    instead = "give a URI Spark reads (dbfs:/..., abfss://...) or a path every node reads (/Volumes/... on Databricks)"
    if (given := local(path)) and (unseen := unseen_paths(spark, {"input": given})):
        _, host, here, there = unseen
        raise SparkFitError(
            f"{path}: {here} on this machine, {there} on the executor on {host} (Spark reads it where its tasks run); "
            f"{instead}"
        )
    if not (output and (given := local(output))):
        return
    folder = Path(os.path.abspath(given)).parent
    while not folder.exists() and folder != folder.parent:  # Spark makes the missing folders, so ask of the nearest
        folder = folder.parent  # one there: the executors would write into their own disks' copies of the rest
    try:
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".scripts-spark-score-") as marker:
            unseen = unseen_paths(spark, {"output": marker.name})
    except OSError:  # a folder not there or not writable: Spark's own error names it
        return
    if unseen:
        raise SparkFitError(
            f"--output {output}: the executor on {unseen[1]} does not see this machine's folder {folder} (Spark "
            "writes the predictions where its tasks run); give a URI Spark writes (dbfs:/..., abfss://...) or a "
            "folder every node sees (/Volumes/... on Databricks)"
        )
