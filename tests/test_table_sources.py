"""Tables of many files (datamodules/table_sources.py): Spark's Parquet folders, hive partitions, globs, MLTables of
folders and patterns, a real Delta table (tests/tables/delta_table, written by the deltalake package: two writes, a
delete, a checkpoint and a write after it; tests/tables/delta_table.expected.csv is deltalake's own reading of it), and
the one-line refusals; then a real fit on a Spark-style folder.

    .venv/bin/python -m pytest -q -p no:cacheprovider tests/test_table_sources.py -n 0
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest

from datamodules.errors import DataError
from datamodules.table import read_table
from tests.conftest import REPO, run_module

DELTA = REPO / "tests" / "tables" / "delta_table"


def rows(count: int, seed: int) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    x1, x2 = rng.normal(size=count).round(3), rng.normal(size=count).round(3)
    colour, label = rng.choice(["red", "green"], count), np.where(x1 + x2 > 0, "hi", "lo")
    return pd.DataFrame({"id": np.arange(count) + 1000 * seed, "x1": x1, "x2": x2, "colour": colour, "label": label})


def spark_folder(folder: Path, parts: list[pd.DataFrame]) -> Path:
    """A folder as Spark's DataFrame.write.parquet leaves it: part files, _SUCCESS, _committed_/_started_ markers
    (Databricks) and Hadoop's .crc checksums."""
    folder.mkdir(parents=True)
    for index, part in enumerate(parts):
        name = f"part-{index:05d}-6f1c-c000.snappy.parquet"
        pq.write_table(pa.Table.from_pandas(part, preserve_index=False), folder / name)
        (folder / f".{name}.crc").write_bytes(b"crc\x00\x01")
    (folder / "_SUCCESS").write_text("")
    (folder / "_committed_4711").write_text('{"added": []}')
    (folder / "_started_4711").write_text("")
    return folder


def as_sorted(frame: pd.DataFrame) -> pd.DataFrame:
    return frame.sort_values("id").reset_index(drop=True)


def test_a_spark_parquet_folder_is_its_part_files_and_names_rows_by_part(tmp_path):
    parts = [rows(5, 1), rows(7, 2), rows(3, 3)]
    frame, row_name = read_table(str(spark_folder(tmp_path / "table", parts)), "csv_path")
    pd.testing.assert_frame_equal(as_sorted(frame), as_sorted(pd.concat(parts)))
    assert row_name(5) == "part-00001-6f1c-c000.snappy.parquet row 1"  # the second part's first row


def test_a_hive_partitioned_folder_gives_its_partition_columns_as_columns(tmp_path):
    table = rows(30, 1).assign(year=np.repeat([2023, 2024, 2025], 10), region=["north", "south"] * 15)
    ds.write_dataset(pa.Table.from_pandas(table, preserve_index=False), tmp_path / "lake", format="parquet",
                     partitioning=["year", "region"], partitioning_flavor="hive")  # fmt: skip
    assert (tmp_path / "lake" / "year=2024" / "region=south").is_dir()
    frame, _ = read_table(str(tmp_path / "lake"), "csv_path")
    assert sorted(frame.columns) == sorted(table.columns)
    merged = as_sorted(frame)[table.columns]
    assert merged["year"].astype(int).tolist() == as_sorted(table)["year"].tolist()
    assert merged["region"].tolist() == as_sorted(table)["region"].tolist()


def test_globs_of_parquet_and_of_csv_files(tmp_path):
    parts = [rows(4, 1), rows(6, 2)]
    folder = spark_folder(tmp_path / "table", parts)
    (folder / "notes.txt").write_text("not data")  # a glob names only what it matches
    frame, _ = read_table(str(folder / "part-*.parquet"), "csv_path")
    assert len(frame) == 10
    exports = tmp_path / "exports"
    exports.mkdir()
    for index, part in enumerate(parts):
        part.to_csv(exports / f"day-{index}.csv", index=False)
    frame, row_name = read_table(str(exports / "*.csv"), "csv_path")
    assert len(frame) == 10 and row_name(4) == "day-1.csv line 2"
    assert frame["x1"].tolist() == pd.concat(parts)["x1"].tolist()  # typed from their text, as one file's


def test_an_mltable_of_a_folder_and_of_a_pattern(tmp_path):
    parts = [rows(4, 1), rows(6, 2)]
    spark_folder(tmp_path / "asset" / "data", parts)
    (tmp_path / "asset" / "MLTable").write_text("paths:\n  - folder: ./data\ntransformations:\n  - read_parquet\n")
    assert len(read_table(str(tmp_path / "asset"), "csv_path")[0]) == 10
    (tmp_path / "asset" / "MLTable").write_text("paths:\n  - pattern: ./data/part-00001-*.parquet\n")
    assert len(read_table(str(tmp_path / "asset"), "csv_path")[0]) == 6
    (tmp_path / "asset" / "MLTable").write_text("paths:\n  - folder: azureml://datastores/lake/paths/x/\n")
    with pytest.raises(DataError, match=r"MLTable: its path 'azureml://.*' is not on this machine"):
        read_table(str(tmp_path / "asset"), "csv_path")


def test_a_delta_table_is_what_its_log_says_now_as_deltalake_reads_it(tmp_path):
    """The folder holds 8 Parquet files, 2 of them removed by the delete: read as a plain folder it would give 10
    deleted rows and 40 twice. Its log: JSON commits 0-3, a Parquet checkpoint at 2."""
    frame, _ = read_table(str(DELTA), "csv_path")
    expected = pd.read_csv(DELTA.with_name("delta_table.expected.csv"))
    frame = as_sorted(frame)[expected.columns]
    assert frame.astype(str).values.tolist() == expected.astype(str).values.tolist()
    assert str(frame["year"].dtype) == "int32"  # the partition column typed as the table's schema says
    copy = tmp_path / "delta"
    shutil.copytree(DELTA, copy)
    commit = copy / "_delta_log" / "00000000000000000004.json"
    vector = {"storageType": "u", "pathOrInlineDv": "x", "cardinality": 1}
    add = {"path": "year=2023/x.parquet", "partitionValues": {"year": "2023"}, "size": 1, "modificationTime": 0,
           "dataChange": True, "deletionVector": vector}  # fmt: skip
    commit.write_text(json.dumps({"add": add}) + "\n")
    with pytest.raises(DataError, match="a Delta table with deletion vectors; rewrite it without them"):
        read_table(str(copy), "csv_path")


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda folder: folder.mkdir(), r"a folder without data files \(CSV or Parquet"),
        (lambda folder: None, r"no file matches it; give data.init_args.csv_path a file, folder or glob"),
        (lambda folder: (folder.mkdir(), rows(3, 1).to_csv(folder / "a.csv"),
                         rows(3, 2).to_parquet(folder / "b.parquet")), r"holds both CSV and Parquet files"),
        (lambda folder: (folder.mkdir(), rows(3, 1).to_csv(folder / "a.csv", index=False),
                         rows(3, 2).drop(columns="x2").to_csv(folder / "b.csv", index=False)),
         r"b.csv has columns \[.*\], .*a.csv \[.*\]; give files of the same columns"),
        (lambda folder: (folder.mkdir(), (folder / "notes.md").write_text("#")),
         r"notes.md is neither a CSV \(.csv, .tsv\) nor a Parquet file"),
    ],
    ids=["empty folder", "glob of nothing", "mixed formats", "other columns", "other files"],
)  # fmt: skip
def test_folders_and_globs_a_table_cannot_be_read_from_are_one_line(tmp_path, make, message):
    folder = tmp_path / "table"
    make(folder)
    path = str(folder) if folder.exists() else str(tmp_path / "part-*.parquet")
    with pytest.raises(DataError, match=message):
        read_table(path, "csv_path")


@pytest.mark.slow
def test_a_fit_on_a_spark_parquet_folder_tests_and_predicts(tmp_path):
    """The table task, by config alone, on a folder as Spark writes it; predict from another such folder."""
    table = spark_folder(tmp_path / "table", [rows(120, 1), rows(120, 2)])
    new = spark_folder(tmp_path / "new", [rows(3, 9).drop(columns="label")])
    outputs = tmp_path / "outputs"
    fit = run_module("scripts.train", "fit", "--config", "configs/table.yaml", "--data.init_args.csv_path", table,
                     "--data.init_args.label", "label", "--trainer.max_epochs", "15", "--trainer.default_root_dir",
                     outputs, "--metrics_file", tmp_path / "metrics.json")  # fmt: skip
    assert fit.returncode == 0, fit.stderr[-3000:]
    assert json.loads((tmp_path / "metrics.json").read_text())["test_acc"] >= 0.8
    (checkpoint,) = outputs.glob("*/*/checkpoints/best.ckpt")
    predict = run_module("scripts.train", "predict", "--config", "configs/table.yaml", "--ckpt_path", checkpoint,
                         "--data.predict_path", new, "--trainer.default_root_dir", outputs)  # fmt: skip
    assert predict.returncode == 0, predict.stderr[-3000:]
    names = [line.split(",")[0] for line in predict.stdout.splitlines()[1:]]
    assert names == [f"part-00000-6f1c-c000.snappy.parquet row {index}" for index in (1, 2, 3)]
