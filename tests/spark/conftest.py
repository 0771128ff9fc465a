"""What the Spark tests share: the Java check and one local-cluster session per test module.

.venv/bin/python -m pytest -q -p no:cacheprovider tests/spark -n 0
"""

from __future__ import annotations

import os
import shutil

import pytest

needs_java = pytest.mark.skipif(
    shutil.which("java") is None, reason="needs Java 17 for Spark (apt-get install openjdk-17-jre-headless; CI has it)"
)
MASTER = "local-cluster[2,1,1024]"  # 2 workers of 1 core and 1 GiB: each task in an executor process of its own


@pytest.fixture(scope="module")
def spark_environment() -> dict[str, str]:
    """Variables the session's processes start with, beyond the test's own (a module overrides this fixture)."""
    return {}


@pytest.fixture(scope="module")
def spark(tmp_path_factory, spark_environment):
    """One local-cluster session for the module, started as scripts.spark starts one; the environment it sets is
    restored after. Its tasks' temporary folder is the module's (each task's torchrun leaves a log folder there)."""
    from scripts.spark.session import LocalSpark

    names = ("SPARK_HOME", "PYSPARK_PYTHON", "SPARK_LOCAL_IP", "TMPDIR", *spark_environment)
    saved = {name: os.environ.get(name) for name in names}
    os.environ.update({"TMPDIR": str(tmp_path_factory.mktemp("spark-tmp")), **spark_environment})
    local = LocalSpark(MASTER)
    yield local.session
    local.stop()
    for name, value in saved.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value
