"""The Spark session a Spark command runs on (scripts.spark fit and score): the one this process has (a Databricks or
Synapse notebook or job, spark-submit, the pyspark shell), or one it starts itself on a local or given master.

    python -m scripts.spark fit --config configs/penguins.yaml --num_processes 2 --master "local-cluster[2,1,1024]"
"""

from __future__ import annotations

import os
import re
import shutil
import sys
import tempfile
from pathlib import Path

from scripts.training.spark_cluster import SparkFitError, check_slots, local_slots


class LocalSpark:
    """A Spark session this process starts itself (not on Databricks, Synapse or under spark-submit), on loopback.

    local-cluster masters (separate executor processes, as on a real cluster) need a Spark home: the executors' work
    folders go there, so it is a temporary folder of links to pyspark's own, not pyspark's package folder.
    """

    def __init__(self, master: str) -> None:
        import pyspark

        self.home: str | None = None
        if master.startswith("local-cluster") and "SPARK_HOME" not in os.environ:
            package = Path(pyspark.__file__).parent
            self.home = tempfile.mkdtemp(prefix="spark-home-")
            for name in ("bin", "jars", "python", "sbin"):
                os.symlink(package / name, Path(self.home) / name)
            os.environ["SPARK_HOME"] = self.home
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)  # executors run this environment's Python
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")  # master, workers and executors on loopback
        from pyspark.sql import SparkSession

        try:
            self.session = self._start(SparkSession, master)
        except Exception as error:  # no Java, a master that does not answer: Spark's answer is a Java trace
            self.stop()
            text = str(error)
            reason = re.search(r"^: (?:[\w.]+Exception: )?(.*)$", text, re.M)
            line = reason[1] if reason else (text.strip().splitlines() or [type(error).__name__])[0]
            raise SparkFitError(
                f"Spark did not start on {master} ({line.strip().rstrip('.')}); check --master, and Java 17 (`java "
                "-version`, JAVA_HOME)"
            ) from None
        # Its executors log a failed task's Java and Python traces at ERROR, here on this console; the task's own line
        # and Spark's exception (kept in the fit's log file) say what failed.
        self.session.sparkContext.setLogLevel("OFF")

    @staticmethod
    def _start(SparkSession, master: str):  # noqa: N803 (the class, imported where pyspark is needed)
        return (
            SparkSession.builder.master(master)
            .appName("lightning-template")
            .config("spark.driver.host", "127.0.0.1")
            .config("spark.driver.bindAddress", "127.0.0.1")
            .config("spark.ui.enabled", "false")
            .config("spark.ui.showConsoleProgress", "false")
            # Start the job once every executor has registered: the barrier stage needs all N slots at once.
            .config("spark.scheduler.minRegisteredResourcesRatio", "1.0")
            .config("spark.scheduler.maxRegisteredResourcesWaitingTime", "120s")
            .config("spark.log.level", "OFF")  # from the start: a failed start's own ERROR lines and Java trace
            .getOrCreate()
        )

    def stop(self) -> None:
        if getattr(self, "session", None) is not None:
            self.session.stop()
        if self.home:
            shutil.rmtree(self.home, ignore_errors=True)
            os.environ.pop("SPARK_HOME", None)


def session(spark, master: str | None, default_master: str, processes: int | None = None):
    """(the session, the LocalSpark this process started or None): `spark` if given, else the one this process has
    (a notebook, spark-submit, the pyspark shell), else a new one on `master` (default: `default_master`), whose
    slots are checked against `processes` before the JVM starts."""
    from pyspark.sql import SparkSession

    spark = spark or SparkSession.getActiveSession()
    if spark is None and "PYSPARK_GATEWAY_PORT" in os.environ:  # under spark-submit or the pyspark shell: theirs
        spark = SparkSession.builder.getOrCreate()
    if spark is not None and master:
        raise SparkFitError(f"--master {master}: this process already has a Spark session; leave --master out")
    if spark is not None:
        return spark, None
    if processes:  # spark.task.cpus is the JVM's to read: 1 until it runs
        check_slots(local_slots(master or default_master), processes)
    local = LocalSpark(master or default_master)  # plain python: a session on this machine, or on --master
    return local.session, local
