"""Fit any task on a Spark cluster: the very same LightningCLI fit, one DDP process per Spark barrier task, started by
pyspark's TorchDistributor (Databricks, Synapse, a Spark cluster of your own, or this machine); and score data with the
registered model there (`score`: mlflow.pyfunc.spark_udf, scripts/spark/score.py).

    python -m scripts.spark fit --config configs/penguins.yaml --num_processes 2
    python -m scripts.spark fit --config configs/mnist.yaml --num_processes 8 --data.init_args.data_dir /dbfs/mnist
    python -m scripts.spark fit --config configs/penguins.yaml --num_processes 2 --master "local-cluster[2,1,1024]"
    make spark TASK=penguins PROCESSES=2
    python -m scripts.spark score models:/penguins-classifier/1 new.csv --output predictions/

Every option but --num_processes and --master is scripts.train's; the config is checked here first, so a typo costs no
cluster time. How N processes map onto tasks and GPUs, where the code and data must be, and what rank 0 tracks are in
docs/spark.md. This process prints rank 0's `test_acc`, or the error of the task that failed in one line and exits 1.
"""

from __future__ import annotations

import contextlib
import os
import sys

from scripts.spark.cluster import (
    SparkFitError,
    check_fit_inputs,
    check_slots,
    local_slots,
    registry_environment,
    session_slots,
)
from scripts.spark.launch import (
    check_launcher,
    plan_launch,
    resolve_trainer,
    split_options,
    task_gpus,
)
from scripts.spark.runs import end_lost_runs, tagged_environment
from scripts.spark.session import session
from scripts.spark.task import (
    REPOSITORY,
    pack_code,
    relative_outputs,
    start_in_task,
    tracking_environment,
)
from scripts.spark.task_output import TaskErrors, failure_line, task_log


def fit_on_spark(argv: list[str], spark=None, dataframe=None, test_dataframe=None, storage: str | None = None) -> dict:
    """Runs the fit of `argv` (scripts.spark's command line) on `spark` or the session this process has or starts;
    returns rank 0's results (test_acc, best_checkpoint, run_id). Raises SparkFitError with the line to print.
    `dataframe` (and `test_dataframe`, tested on instead of a share of it): the table task's data, written once as
    Parquet under `storage`, a folder every task reads (scripts/spark/dataframes.py)."""
    num_processes, master, args = split_options(argv)
    if dataframe is not None:
        args = [*args, "--data.init_args.csv_path", "(the DataFrame)"]  # checked with the rest, set once written
    config = resolve_trainer(args)
    check_launcher(config.trainer)  # before any Spark start; the GPUs of a task are known once a session is there
    from pyspark import cloudpickle

    spark, local = session(spark or (dataframe.sparkSession if dataframe is not None else None), master,
                           f"local[{num_processes}]", processes=num_processes)  # fmt: skip
    try:
        if dataframe is not None:
            from scripts.spark.dataframes import dataframe_args

            args = dataframe_args(args[:-2], config, dataframe, test_dataframe, storage)
            config = resolve_trainer(args)  # with the data's folders, which the executors are asked about
        launch = plan_launch(config.trainer, num_processes, task_gpus(spark))
        check_slots(session_slots(spark), num_processes, launch.num_nodes)
        if local_slots(spark.conf.get("spark.master", "") or "") is None:  # executors elsewhere, not on this disk
            check_fit_inputs(spark, config)
        environment = registry_environment(config, tracking_environment(config.trainer.logger), spark)
        environment, fit = tagged_environment(environment)
        from pyspark.ml.torch.distributor import TorchDistributor

        distributor = TorchDistributor(num_processes=num_processes, local_mode=False, use_gpu=launch.use_gpu)
        cloudpickle.register_pickle_by_value(sys.modules[start_in_task.__module__])  # executors lack the module
        task_args = [*args, *launch.trainer_args()]
        log_path = task_log(config.trainer.default_root_dir)
        if local:
            local.trace_log = log_path  # the driver JVM's Java traces (a lost executor's), as the tasks' tracebacks
        with log_path.open("w") as log:
            errors = TaskErrors(sys.stderr, log)
            sys.stderr = errors
            try:
                code = pack_code()
                relative = relative_outputs(config, environment)
                result = distributor.run(
                    start_in_task, str(REPOSITORY), os.getcwd(), code, task_args, environment, relative
                )
            except Exception as error:
                log.write(f"\n{type(error).__name__}: {error}\n")  # Spark's own report, its Java trace with it
                line = failure_line(error, errors.failures, errors.killed)
                killed = errors.killed or "ExecutorLostFailure" in str(error)
                for run_id in end_lost_runs(config, environment, fit, "KILLED" if killed else "FAILED"):
                    log.write(f"MLflow run {run_id} ended as {'KILLED' if killed else 'FAILED'} by the driver\n")
                raise SparkFitError(f"{line} (the tasks' whole output: {log_path})") from None
            finally:
                sys.stderr = errors.stream
        if result is None:
            raise SparkFitError(f"rank 0 of the Spark fit returned no result (the tasks' whole output: {log_path})")
        if errors.muted:  # a traceback that did not stop the fit: what followed it is in the log alone
            print(f"a task printed a traceback; the tasks' whole output: {log_path}", file=sys.stderr)
        else:
            log_path.unlink()  # a fit that finished: its output was on the console
            with contextlib.suppress(OSError):  # spark-logs/ goes too when it holds no other fit's
                log_path.parent.rmdir()
        return result
    finally:
        if local:
            local.stop()


def predict_on_spark(model_uri: str, dataframe, spark=None, label: str | None = None):
    """`dataframe` with the registered model's `prediction`, `prediction_index` and `probability` columns (and
    `label_index` with `label`): scripts/spark/dataframes.py."""
    from scripts.spark.dataframes import predict_on_spark as predict

    return predict(model_uri, dataframe, spark, label)


def score_on_spark(argv: list[str], spark=None) -> dict:
    """Runs `score MODEL INPUT [--output DIR] [--label COLUMN] [--master MASTER]` (argv without `score`) on `spark`
    or the session this process has or starts; returns {"rows", "accuracy"}. Raises SparkFitError with the line."""
    registry, scoring = serving_modules()
    model_uri, path, values = split_score_options(argv)
    try:
        scoring.check_arguments(model_uri, path, values.get("--output"))
        if model_uri.startswith(registry.REGISTRY_URIS):  # found where scripts.serve finds it, before Spark starts
            registry.use_store(model_uri)
        scoring.check_local_header(model_uri, path)
        spark, local = session(spark, values.get("--master"), "local[*]")
        try:
            if local_slots(spark.conf.get("spark.master", "") or "") is None:  # executors elsewhere, not on this disk
                scoring.check_score_paths(spark, path, values.get("--output"))
            return scoring.score(spark, model_uri, path, values.get("--output"), values.get("--label"))
        finally:
            if local:
                local.stop()
    except (scoring.SparkScoreError, registry.RegistryError) as error:
        raise SparkFitError(str(error)) from None


def serving_modules():
    """The registered model's look-up and Spark's scoring with it: the serving extra's (scripts/spark/score.py goes
    with it); one line where this checkout dropped it."""
    from scripts.training.extras import ExtraMissing, load

    try:
        return load("scripts.serving.model_registry", "serving", "score"), load(
            "scripts.spark.score", "serving", "score"
        )
    except ExtraMissing as error:
        raise SparkFitError(str(error)) from None


def split_score_options(argv: list[str]) -> tuple[str, str, dict[str, str]]:
    """(model, input, {option: value}) of score's command line (without `score`); nothing checked on disk."""
    options = serving_modules()[1].SPARK_OPTIONS
    values: dict[str, str] = {}
    positional: list[str] = []
    args = iter(argv)
    for arg in args:
        name, equals, value = arg.partition("=")
        if name in options:
            values[name] = value if equals else next(args, "")
        elif arg.startswith("--"):
            raise SparkFitError(f"{name}: score takes {', '.join(options)} (python -m scripts.spark --help)")
        else:
            positional.append(arg)
    if len(positional) != 2:
        raise SparkFitError("score takes a model and an input: score MODEL CSV_OR_FOLDER [--output DIR]")
    return positional[0], positional[1], values


USAGE = """usage: python -m scripts.spark fit --num_processes N [--master MASTER] [scripts.train fit options]
       python -m scripts.spark score MODEL CSV_OR_FOLDER [--output DIR] [--label COLUMN] [--master MASTER]

fit: a task on Spark, one DDP process per Spark barrier task, started by TorchDistributor.
score: a CSV of rows or a folder of images with a registered MLflow model (models:/NAME/VERSION, runs:/ID/model, a
folder), through mlflow.pyfunc.spark_udf; writes the predictions as CSV to --output (a new folder) and prints the
accuracy when the inputs carry their answer (the CSV's --label column; images in folders named by class).

options:
  -h, --help            show this help and exit; `fit --help` adds scripts.train fit's options
  --num_processes N     processes to train (Spark barrier tasks x the GPUs of a task), 1 or more
  --master MASTER       the Spark master when this process has no session (default local[N]),
                        e.g. local-cluster[2,1,1024] or spark://host:7077
  every other option is scripts.train fit's (--config, --trainer.*, --data.*, --model.*), except
  --trainer.devices and --trainer.num_nodes, which --num_processes sets
"""


def main(argv: list[str] | None = None) -> None:
    """Prints rank 0's best checkpoint, MLflow run and test_acc; a failure is one line on stderr and exit status 1."""
    argv = sys.argv[1:] if argv is None else argv
    if any(arg in ("-h", "--help") for arg in argv):
        print(USAGE)
        if argv[:1] == ["fit"]:
            from scripts.train import cli_main

            print("scripts.train fit's options:", flush=True)
            sys.argv[1:] = ["fit", "--help"]  # from sys.argv: LightningCLI warns of args given beside it
            cli_main()  # prints them and exits 0
        return
    if argv[:1] == ["score"]:
        try:
            result = score_on_spark(argv[1:])
        except SparkFitError as error:
            sys.exit(f"error: {error}")
        print(f"scored {result['rows']} inputs")
        if result["accuracy"] is not None:
            print(f"accuracy: {result['accuracy']:.4f}")
        return
    try:
        result = fit_on_spark(argv)
    except SparkFitError as error:
        sys.exit(f"error: {error}")
    if result.get("best_checkpoint"):
        print(f"best checkpoint: {result['best_checkpoint']} (on the node of rank 0)")
    if result.get("run_id"):
        print(f"mlflow run: {result['run_id']}")
    if result.get("test_acc") is not None:
        print(f"test_acc: {result['test_acc']:.4f}")
