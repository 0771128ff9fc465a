"""scripts/bench/serve.py runs end to end as `make bench-serve` runs it, at its smallest (2 requests a round, 1 round,
Spark on 20 rows on `local[1]`): each round's requests/s, p50 and p99 of every variant and case as measured, then
their medians and ratios to the inference server's, then spark_udf against scripts.score, each round's rows/s as
measured and their best. Times are not checked (the bench is where they are read).

.venv/bin/python -m pytest -q tests/bench/test_bench_serve.py
"""

from __future__ import annotations

import os
import re
import shutil  # extra: spark

import pytest

from tests.bench.printed import (
    assert_every_round,  # extra: spark
    summary_figure,
)
from tests.conftest import REPO, run_module

CASES = ("penguins, 1 row", "penguins, 100 rows", "birds, 1 JPEG 500x375")
SERVE_PYTHON = REPO / ".venv-serve" / "bin" / "python"
VARIANTS = ("azmlinfsrv + score.py", "mlflow models serve", "pyfunc in-process")


@pytest.mark.slow  # four servers started, and a Spark session
@pytest.mark.skipif(not SERVE_PYTHON.is_file(), reason="needs .venv-serve: `make serve-env` (.ci/run builds it)")
# extra: spark
@pytest.mark.skipif(
    shutil.which("java") is None, reason="needs Java 17 for Spark (apt-get install openjdk-17-jre-headless; CI has it)"
)
# end extra: spark
def test_prints_every_runtime_as_measured_then_medians_ratios_and_batch_scoring():
    args = ["--requests", "2", "--image_requests", "1", "--rounds", "1"]
    args += ["--spark_rows", "20", "--master", "local[1]"]  # extra: spark
    result = run_module("scripts.bench.serve", *args)
    assert result.returncode == 0, result.stderr[-3000:]
    printed = result.stdout
    for case in CASES:
        for variant in VARIANTS:
            line = rf"^round 1, {re.escape(case)}, {re.escape(variant)}: (\S+) req/s, p50 \S+ ms, p99 \S+ ms$"
            assert summary_figure(printed, line) > 0
            line = rf"^  {re.escape(case)} +{re.escape(variant)} +\S+ req/s +p50 .* ms +(\S+)x azmlinfsrv$"
            assert summary_figure(printed, line) > 0
    assert "serving the registered pyfunc: 1 worker(s) a server" in printed
    # extra: spark
    assert_every_round(printed, ("spark_udf, local[1]", "scripts.score (1 process)"), "rows/s", rounds=1)
    assert "batch scoring of 20 penguin rows from one CSV, best of 1 rounds:" in printed
    assert summary_figure(printed, r"^  scripts.score \(1 process\) +(\S+) rows/s$") > 0
    assert summary_figure(printed, r"^  spark_udf, local\[1\] +\S+ rows/s +(\S+)x scripts.score$") > 0
    # end extra: spark


def test_the_serving_bench_takes_the_server_s_bounds_and_bounded_counts():
    from scripts.bench.serve import bench

    cores = len(os.sched_getaffinity(0))
    for options, line in (
        ({"workers": 1000000}, f"error: --workers 1000000: give 1 to {2 * cores + 1}"),
        ({"threads": 1000}, "error: --threads 1000: give 0 (one per core) to"),
        ({"rounds": 0}, "error: --rounds 0: give 1 to 100"),
        ({"requests": 10**9}, "error: --requests 1000000000: give 1 to 100000"),
    ):
        with pytest.raises(SystemExit) as exit:
            bench(**options)
        assert str(exit.value.code).startswith(line), exit.value.code
