"""The test suite. `make test` runs it in three pytest-xdist workers on CI's 2 cores, so each test process gets one
thread of torch's, as torchrun gives each rank: with torch's default, one thread per core, the OpenMP threads of one
worker's fit spin-wait against the other workers (docs/measured.md). Set here, before anything imports torch; the
processes tests start inherit it.

The Spark sessions the tests start (and the `scripts.spark` commands they run) live seconds and run tiny jobs: their
JVMs, driver and executors, compile with the quick JIT compiler alone and collect garbage in one thread. HotSpot's
optimising compiler took half of such a JVM's CPU, for code that never runs long enough to gain from it. How Spark
behaves is the same; a user's sessions keep Java's defaults.
"""

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")
QUICK_JVM = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC -XX:CICompilerCount=1"
os.environ.setdefault(
    "PYSPARK_SUBMIT_ARGS",
    f"--driver-java-options '{QUICK_JVM}' --conf 'spark.executor.extraJavaOptions={QUICK_JVM}' pyspark-shell",
)
