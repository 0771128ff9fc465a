"""The Spark session a Spark command runs on (scripts.spark fit and score): the one this process has (a Databricks or
Synapse notebook or job, spark-submit, the pyspark shell), or one it starts itself on a local or given master.

    python -m scripts.spark fit --config configs/penguins.yaml --num_processes 2 --master "local-cluster[2,1,1024]"
"""

from __future__ import annotations

import atexit
import functools
import os
import re
import shutil
import sys
import tempfile
import threading
from pathlib import Path

from scripts.spark.cluster import SparkFitError, check_slots, local_slots
from scripts.training.machine import usable_cores

# A Java exception and its stack, as the JVM prints them: `java.util...Exception: ...`, `\tat ...`, `Caused by: ...`.
JAVA_TRACE = re.compile(r"([\w$]+\.)+[\w$]*(Exception|Error)\b|\s+at |Caused by: |\s+\.\.\. \d+ more|\s+Suppressed: ")


class LocalSpark:
    """A Spark session this process starts itself (not on Databricks, Synapse or under spark-submit), on loopback.

    local-cluster masters (separate executor processes, as on a real cluster) need a Spark home: the executors' work
    folders go there, so it is a temporary folder of links to pyspark's own, not pyspark's package folder. It is one
    for the process and lives until it exits (`spark_home`): pyspark keeps its JVM, started with that home, for the
    next session, whose executors would not start from a home deleted with the first session.
    """

    def __init__(self, master: str) -> None:
        import pyspark

        if master.startswith("local-cluster") and "SPARK_HOME" not in os.environ:
            os.environ["SPARK_HOME"] = spark_home(Path(pyspark.__file__).parent)
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)  # executors run this environment's Python
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")  # master, workers and executors on loopback
        from pyspark.sql import SparkSession

        self.trace_log: Path | None = None  # where the JVM's Java traces go (None: spark-driver-PID.log, temporary)
        try:
            self.session = self._start_with_stderr_read(SparkSession, master)
        except Exception as error:  # no Java, a master that does not answer: Spark's answer is a Java trace
            self.stop()
            if getattr(self, "forwarder", None) is not None:  # the launcher's own lines, before the one line
                self.forwarder.join(timeout=5)
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

    def _start_with_stderr_read(self, SparkSession, master: str):  # noqa: N803
        """The session, its JVM started with a pipe for stderr: the JVM prints some Java traces there itself (a lost
        executor's RejectedExecutionException), past log4j's level. A thread reads it: Java traces go to `trace_log`,
        every other line (the launcher's own, when Java is missing) to this process's stderr."""
        self.console = os.fdopen(os.dup(2), "w", buffering=1, errors="replace")
        read, write = os.pipe()
        self.forwarder = threading.Thread(target=self._forward, args=(read,), daemon=True)
        self.forwarder.start()
        saved = os.dup(2)
        sys.stderr.flush()
        os.dup2(write, 2)  # what the JVM inherits as it starts
        try:
            return self._start(SparkSession, master)
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            os.close(write)

    def _forward(self, read: int) -> None:
        with os.fdopen(read, errors="replace") as lines:
            for line in lines:
                if JAVA_TRACE.match(line):
                    path = self.trace_log or Path(tempfile.gettempdir()) / f"spark-driver-{os.getpid()}.log"
                    with open(path, "a") as log:
                        log.write(line)
                else:
                    self.console.write(line)

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


@functools.cache
def spark_home(package: Path) -> str:
    """The process's Spark home for local-cluster masters (LocalSpark says why one): links to pyspark's `package`
    folders in a temporary folder, removed at exit."""
    home = tempfile.mkdtemp(prefix="spark-home-")
    for name in ("bin", "jars", "python", "sbin"):
        os.symlink(package / name, Path(home) / name)
    atexit.register(shutil.rmtree, home, True)
    return home


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
    check_this_machine(master, default_master)
    local = LocalSpark(master or default_master)  # plain python: a session on this machine, or on --master
    return local.session, local


TASKS_PER_CORE = 4  # a local master's task slots this machine runs, at most, per core: each task is a Python process


def check_this_machine(master: str | None, default_master: str) -> None:
    """Refuses a local master past what this machine runs: more task slots than TASKS_PER_CORE x its cores (each a
    process: `--num_processes 1000000` made local[1000000]), or local-cluster workers' memory past its own."""
    import re

    slots = local_slots(master or default_master)
    if slots is None:
        return
    cores = usable_cores()
    most = TASKS_PER_CORE * cores
    if slots.count > most:
        given = f"--master {master}" if master else f"--num_processes {slots.count}"
        raise SparkFitError(
            f"{given}: {slots.count} task processes on this machine's {cores} cores; give at most {most} "
            f"({TASKS_PER_CORE} a core), or --master of a cluster"
        )
    found = re.fullmatch(r"local-cluster\[(\d+),\s*\d+,\s*(\d+)\]", master or "")
    memory_mb = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 2**20
    if found and int(found[1]) * int(found[2]) > memory_mb:
        raise SparkFitError(
            f"--master {master}: {found[1]} workers of {found[2]} MB, more than this machine's {memory_mb} MB; give "
            "less memory per worker (the third number, in MB)"
        )
