"""A table past data.init_args.memory_budget_mb, streamed (datamodules/table_stream.py): the budget forced tiny, the
same small tables read whole and streamed must split the same rows, type and scale the same columns and give the network
the same inputs; DataLoader workers and processes each read their own row groups, every training row once an epoch
and every test row once over the processes; a streamed checkpoint tests and resumes. Peak memory against the rows is
the bench's (scripts/bench/table.py), not a test's.

    .venv/bin/python -m pytest -q -p no:cacheprovider tests/test_table_stream.py -n 0
"""

from __future__ import annotations

import csv
import json
import tempfile
import threading
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from datamodules.errors import DataError
from datamodules.table import TableDataModule
from datamodules.table_stream_batches import READ_AHEAD, StreamedRows
from tests.conftest import run_module
from tests.test_table import make_table

DDP = ["--config", "configs/trainer/ddp.yaml", "--trainer.accelerator", "cpu", "--trainer.devices", "2"]
STREAMED = ["--data.init_args.memory_budget_mb", "0"]


def lake(folder: Path, rows: int = 900, seed: int = 1) -> Path:
    """A hive-partitioned Parquet folder of three part files a region, row groups of 40 rows: many units of work. Its
    `visits`, whole numbers with missing cells, pandas reads whole as floats (3.0), which hash otherwise than 3."""
    frame = make_table(rows, seed)
    frame["region"] = ["north", "south"] * (rows // 2)
    frame["visits"] = pd.array([None if i % 97 == 0 else i % 5 for i in range(rows)], dtype="Int64")
    for region, part in frame.groupby("region"):
        (folder / f"region={region}").mkdir(parents=True)
        for index in range(3):
            piece = part.iloc[index::3].drop(columns="region")
            table = pa.Table.from_pandas(piece, preserve_index=False).replace_schema_metadata(None)  # as Spark's
            pq.write_table(table,
                           folder / f"region={region}" / f"part-{index}.parquet", row_group_size=40)  # fmt: skip
    (folder / "_SUCCESS").touch()
    return folder


def delta_lake(folder: Path, rows: int = 900, seed: int = 5) -> Path:
    """A Delta table partitioned by region (a string) and year (an integer, typed by the log's schema): commit 0 adds
    six part files of row groups of 40, commit 1 removes one and adds its rows rewritten without its first ten, so the
    folder holds rows the table no longer does. Its log written as Spark and delta-rs write it."""
    frame = make_table(rows, seed).assign(region=["north", "south", "east"] * (rows // 3), year=2024)
    frame.loc[frame.index % 2 == 0, "year"] = 2025
    delta_types = {"int64": "long", "float64": "double", "object": "string"}
    fields = [{"name": name, "type": delta_types.get(str(kind), "string"), "nullable": True, "metadata": {}}
              for name, kind in frame.drop(columns=["region", "year"]).dtypes.items()]  # fmt: skip
    fields += [{"name": "region", "type": "string", "nullable": True, "metadata": {}},
               {"name": "year", "type": "integer", "nullable": True, "metadata": {}}]  # fmt: skip
    schema = json.dumps({"type": "struct", "fields": fields})
    metadata = {"id": "t", "format": {"provider": "parquet", "options": {}}, "schemaString": schema,
                "partitionColumns": ["region", "year"], "configuration": {}}  # fmt: skip
    adds = []
    for (region, year), part in frame.groupby(["region", "year"]):
        path = f"region={region}/year={year}/part-{len(adds)}.parquet"
        (folder / path).parent.mkdir(parents=True)
        pq.write_table(pa.Table.from_pandas(part.drop(columns=["region", "year"]), preserve_index=False),
                       folder / path, row_group_size=40)  # fmt: skip
        adds.append({"path": path, "partitionValues": {"region": region, "year": str(year)}, "dataChange": True})
    log = folder / "_delta_log"
    log.mkdir()
    first = [{"protocol": {"minReaderVersion": 1, "minWriterVersion": 2}}, {"metaData": metadata}]
    (log / f"{0:020d}.json").write_text("\n".join(json.dumps(line) for line in first + [{"add": a} for a in adds]))
    removed = adds[0]
    rewritten = {**removed, "path": removed["path"].replace("part-0", "part-6")}
    kept = pq.read_table(folder / removed["path"]).slice(10)
    pq.write_table(kept, folder / rewritten["path"], row_group_size=40)
    second = [{"remove": {"path": removed["path"], "dataChange": True}}, {"add": rewritten}]
    (log / f"{1:020d}.json").write_text("\n".join(json.dumps(line) for line in second))
    return folder


def mltable(folder: Path, kind: str) -> Path:
    """An MLTable folder: a pattern naming a lake's part files, or a folder of CSV files read_delimited reads."""
    if kind == "pattern":
        lake(folder / "lake")
        (folder / "MLTable").write_text("paths:\n  - pattern: ./lake/region=*/part-*.parquet\n")
        return folder
    (folder / "exports").mkdir(parents=True)
    for index in range(3):
        make_table(300, seed=10 + index).to_csv(folder / "exports" / f"day-{index}.tsv", sep="\t", index=False)
    (folder / "MLTable").write_text("paths:\n  - folder: ./exports\ntransformations:\n  - read_delimited:\n"
                                    "      delimiter: \"\\t\"\n")  # fmt: skip
    return folder


SOURCES = {"parquet folder": lambda folder: lake(folder / "lake"),
           "delta table": lambda folder: delta_lake(folder / "d"),
           "mltable of a pattern": lambda folder: mltable(folder / "m", "pattern"),
           "mltable of csv files": lambda folder: mltable(folder / "m", "delimited")}  # fmt: skip


def rows_of(inputs: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Each row's network inputs and class, in sorted order: a split's rows whatever their order."""
    return torch.tensor(sorted(map(tuple, torch.cat([inputs, labels[:, None].float()], dim=1).tolist())))


def same_rows(ours: torch.Tensor, theirs: torch.Tensor) -> bool:
    return ours.shape == theirs.shape and torch.allclose(ours, theirs, atol=1e-5)


def loaded(data: TableDataModule, split: str) -> tuple[torch.Tensor, torch.Tensor]:
    inputs, labels = zip(*getattr(data, f"{split}_dataloader")())
    return torch.cat(inputs), torch.cat(labels)


@pytest.mark.parametrize("kind", [*SOURCES, "csv"])
def test_a_streamed_table_splits_types_and_scales_as_one_read_whole(tmp_path, kind, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # the CSV's Parquet copy goes under the system's
    source = SOURCES[kind](tmp_path) if kind in SOURCES else tmp_path / "t.csv"
    if kind == "csv":
        make_table(500, seed=2).to_csv(source, index=False)
        assert not list(tmp_path.glob("table-cache/*/t.parquet"))
    whole, streamed = (
        TableDataModule(str(source), "species"),
        TableDataModule(str(source), "species", memory_budget_mb=0),
    )
    assert whole.stream is None and streamed.stream is not None
    whole.setup("fit")
    streamed.setup("fit")
    assert streamed.class_names == whole.class_names
    assert streamed.state["left_out"] == whole.state["left_out"]
    for ours, theirs in zip(streamed.state["columns"], whole.state["columns"], strict=True):
        numbers = [key for key, value in theirs.items() if isinstance(value, float)]
        assert {key: ours[key] for key in numbers} == pytest.approx({key: theirs[key] for key in numbers})
        assert {key: value for key, value in ours.items() if key not in numbers} == {
            key: value for key, value in theirs.items() if key not in numbers
        }  # kinds, categories, exactly; means and deviations up to the order of summing
    assert streamed.identity["schema"] == whole.identity["schema"]
    assert streamed.identity["split"] == whole.identity["split"]
    for split in ("train", "val", "test"):
        assert streamed.identity["splits"][split]["rows"] == whole.identity["splits"][split]["rows"]
        assert same_rows(rows_of(*loaded(streamed, split)), rows_of(*whole.splits[split]))
    assert len(list(tmp_path.glob("table-cache/*/t.parquet"))) == (kind == "csv")  # made once, where said


def test_the_budget_sees_a_delta_table_and_an_mltable_as_the_files_they_hold(tmp_path):
    from datamodules.table import in_memory_mb

    table = delta_lake(tmp_path / "d")
    live = [path for path in table.rglob("part-*.parquet") if path.name != "part-0.parquet"]  # removed by commit 1
    columns = len(pq.read_schema(live[0]).names) + 2  # and its two partition columns
    cells = sum(pq.read_metadata(path).num_rows for path in live) * columns
    assert in_memory_mb(str(table)) == pytest.approx(cells * 70 / 2**20)
    folder = mltable(tmp_path / "m", "pattern")
    assert in_memory_mb(str(folder)) == in_memory_mb(str(folder / "lake" / "region=*" / "part-*.parquet")) > 0


def test_a_table_below_its_budget_is_read_whole(tmp_path):
    make_table(100, seed=3).to_parquet(tmp_path / "t.parquet")
    assert TableDataModule(str(tmp_path / "t.parquet"), "species").stream is None
    assert TableDataModule(str(tmp_path / "t.parquet"), "species", memory_budget_mb=0.001).stream is not None


def test_two_dataloader_workers_read_every_training_row_once_an_epoch(tmp_path):
    source = lake(tmp_path / "lake")
    whole = TableDataModule(str(source), "species")
    whole.setup("fit")
    streamed = TableDataModule(str(source), "species", memory_budget_mb=0, num_workers=2, batch_size=16)
    streamed.setup("fit")
    loader = streamed.train_dataloader()
    epochs = []
    for _ in range(2):
        inputs, labels = zip(*loader)
        assert len(inputs) == len(loader)  # the length Lightning counts steps by
        epochs.append(torch.cat(inputs).tolist())
        assert same_rows(rows_of(torch.cat(inputs), torch.cat(labels)), rows_of(*whole.splits["train"]))
    assert epochs[0] != epochs[1]  # each epoch its own order


def reads_recorded(monkeypatch) -> list[str]:
    """The name of the thread that reads each row group, as StreamedRows reads them from now on."""
    read_by, unit_rows = [], StreamedRows.unit_rows

    def recorded(self, unit, order):
        read_by.append(threading.current_thread().name)
        return unit_rows(self, unit, order)

    monkeypatch.setattr(StreamedRows, "unit_rows", recorded)
    return read_by


def read_ahead_threads() -> list[threading.Thread]:
    return [thread for thread in threading.enumerate() if thread.name.startswith(READ_AHEAD)]


def test_the_next_row_group_is_read_in_a_thread_while_the_loop_trains_and_the_batches_stay_the_same(
    tmp_path, monkeypatch
):
    streamed = TableDataModule(str(lake(tmp_path / "lake")), "species", memory_budget_mb=0, batch_size=16)
    streamed.setup("fit")
    read_by = reads_recorded(monkeypatch)
    batches = iter(streamed.train_dataloader())
    first = next(batches)
    assert 1 <= len(read_by) <= 2  # the first row group, and the next one at most
    inputs, labels = zip(first, *batches)
    assert len(read_by) > 2 and all(name.startswith(READ_AHEAD) for name in read_by)  # not the loop's own thread
    # The same rows, in the same order, as each row group's made here, in turn, without a thread.
    rows = streamed.train_dataloader().dataset
    rows.epoch = 0
    made_here = list(rows.unit_arrays(0))
    assert torch.equal(torch.cat(inputs), torch.cat([torch.from_numpy(part) for part, _ in made_here]))
    assert torch.equal(torch.cat(labels), torch.cat([torch.from_numpy(part) for _, part in made_here]))
    assert {len(batch) for batch in labels[:-1]} == {16}


def test_a_loop_that_stops_early_or_fails_leaves_no_read_ahead_thread(tmp_path, monkeypatch):
    streamed = TableDataModule(str(lake(tmp_path / "lake")), "species", memory_budget_mb=0, batch_size=16)
    streamed.setup("fit")
    batches = iter(streamed.train_dataloader())
    next(batches)
    assert read_ahead_threads()
    del batches  # a loop stopped early (limit_train_batches, Lightning's sanity check)
    for thread in read_ahead_threads():
        thread.join(timeout=60)
    assert not read_ahead_threads()
    read_by, unit_rows = [], StreamedRows.unit_rows

    def failing(self, unit, order):  # a row group unreadable past the first
        read_by.append(unit)
        if len(read_by) > 1:
            raise DataError(f"row group {unit} unreadable")
        return unit_rows(self, unit, order)

    monkeypatch.setattr(StreamedRows, "unit_rows", failing)
    with pytest.raises(DataError, match=r"row group \d+ unreadable"):
        list(streamed.train_dataloader())
    for thread in read_ahead_threads():
        thread.join(timeout=60)
    assert not read_ahead_threads()


def test_processes_each_train_as_many_batches_and_test_rows_once():
    from datamodules.table_stream_batches import plan

    counts = [40, 40, 13, 0, 40, 7]  # a split's rows in each row group
    training = plan(counts, world_size=3, workers=2, batch_size=16, pad=True)
    assert len({sum(batches for _, _, batches in rank) for rank in training}) == 1
    testing = plan(counts, world_size=3, workers=2, batch_size=16, pad=False)
    units = sorted(unit for rank in testing for worker_units, _, _ in rank for unit in worker_units)
    assert units == [0, 1, 2, 4, 5]  # every row group once, the empty one nowhere
    assert sum(rows for rank in testing for _, rows, _ in rank) == sum(counts)


def confusion_total(outputs: Path) -> int:
    (matrix,) = outputs.glob("*/*/evaluation/confusion_matrix.csv")
    return sum(int(cell) for row in list(csv.reader(matrix.open()))[1:] for cell in row[1:])


@pytest.mark.slow
def test_a_streamed_fit_resumes_and_tests_every_row_once_on_two_processes(tmp_path):
    source = lake(tmp_path / "lake")
    config = ["--config", "configs/table.yaml", "--data.init_args.csv_path", source, "--data.init_args.label",
              "species", "--data.init_args.batch_size", "16"]  # fmt: skip
    fit = run_module("scripts.train", "fit", *config, *STREAMED, "--data.init_args.num_workers", "2",
                     "--trainer.max_epochs", "2", "--trainer.default_root_dir", tmp_path / "fit", "--metrics_file",
                     tmp_path / "fit.json")  # fmt: skip
    assert fit.returncode == 0, fit.stderr[-3000:]
    assert "streamed (900 rows in 24 row groups" in fit.stderr
    (last,) = (tmp_path / "fit").glob("*/*/checkpoints/last.ckpt")
    resumed = run_module("scripts.train", "fit", *config, *STREAMED, "--ckpt_path", last, "--trainer.max_epochs", "3",
                         "--trainer.default_root_dir", tmp_path / "resumed")  # fmt: skip
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "not the table the checkpoint saw" not in resumed.stderr
    whole = TableDataModule(str(source), "species")
    whole.setup("test")
    test_rows = len(whole.splits["test"][1])
    accuracies = {}
    for name, extra in (("streamed on two processes", [*STREAMED, *DDP]), ("read whole", [])):
        outputs = tmp_path / name
        tested = run_module("scripts.train", "test", *config, *extra, "--ckpt_path", last.parent / "best.ckpt",
                            "--trainer.default_root_dir", outputs, "--metrics_file", outputs / "m.json")  # fmt: skip
        assert tested.returncode == 0, tested.stderr[-3000:]
        assert confusion_total(outputs) == test_rows  # each test row once over the processes
        accuracies[name] = json.loads((outputs / "m.json").read_text())["test_acc"]
    # The rows read whole and streamed are the same test rows, scored alike, as the fit scored them.
    assert accuracies["streamed on two processes"] == pytest.approx(accuracies["read whole"], abs=1e-6)
    assert json.loads((tmp_path / "fit.json").read_text())["test_acc"] == pytest.approx(accuracies["read whole"])


def test_a_streamed_table_names_an_empty_label_cell_by_its_file_and_row(tmp_path):
    frame = make_table(120, seed=4)
    frame.loc[70, "species"] = None
    pq.write_table(pa.Table.from_pandas(frame, preserve_index=False), tmp_path / "t.parquet", row_group_size=50)
    data = TableDataModule(str(tmp_path / "t.parquet"), "species", memory_budget_mb=0)
    with pytest.raises(DataError, match=r"label column 'species' is empty on t.parquet row 71;"):
        assert data.class_names


def test_a_streamed_table_that_changed_since_its_checkpoint_is_said_in_one_line(tmp_path, capsys):
    from datamodules.split_check import check_trained

    before = TableDataModule(str(lake(tmp_path / "before")), "species", memory_budget_mb=0)
    before.setup("fit")
    after = TableDataModule(str(lake(tmp_path / "after", rows=960)), "species", memory_budget_mb=0)
    after.setup("fit")
    check_trained(after, before.identity)
    assert f"{tmp_path / 'after'}: not the table the checkpoint saw (900 rows then, 960 now; a streamed table's " in (
        capsys.readouterr().err
    )


def test_a_streamed_test_path_gives_the_test_rows_of_one_read_whole(tmp_path):
    from datamodules.table import in_memory_mb

    source, tests = lake(tmp_path / "train"), lake(tmp_path / "test", rows=1800, seed=7)
    between = (in_memory_mb(str(source)) + in_memory_mb(str(tests))) / 2  # the training table in memory, test_path not
    modules = {budget: TableDataModule(str(source), "species", test_path=str(tests), memory_budget_mb=budget)
               for budget in (2048, between, 0)}  # fmt: skip
    assert [(data.stream is None, data.test_stream is None) for data in modules.values()] == [
        (True, True),
        (True, False),
        (False, False),
    ]
    for data in modules.values():
        data.setup("fit")
    whole = modules[2048]
    for data in (modules[between], modules[0]):
        assert data.identity["splits"]["test"]["rows"] == 1800 == len(whole.splits["test"][1])
        assert data.identity["splits"]["test"]["source"] == str(tests)
        assert same_rows(rows_of(*loaded(data, "test")), rows_of(*whole.splits["test"]))
        assert same_rows(rows_of(*loaded(data, "val")), rows_of(*whole.splits["val"]))


@pytest.mark.slow
def test_a_streamed_test_path_tests_as_one_read_whole_on_two_processes(tmp_path):
    source, tests = lake(tmp_path / "train"), lake(tmp_path / "test", rows=600, seed=7)
    config = ["--config", "configs/table.yaml", "--data.init_args.csv_path", source, "--data.init_args.label",
              "species", "--data.init_args.test_path", tests, "--data.init_args.batch_size", "16"]  # fmt: skip
    fit = run_module("scripts.train", "fit", *config, "--trainer.max_epochs", "2", "--trainer.default_root_dir",
                     tmp_path / "fit", "--metrics_file", tmp_path / "fit.json")  # fmt: skip
    assert fit.returncode == 0, fit.stderr[-3000:]
    (best,) = (tmp_path / "fit").glob("*/*/checkpoints/best.ckpt")
    accuracies = {}
    for name, extra in (("streamed on two processes", [*STREAMED, *DDP]), ("read whole", [])):
        outputs = tmp_path / name
        tested = run_module("scripts.train", "test", *config, *extra, "--ckpt_path", best,
                            "--trainer.default_root_dir", outputs, "--metrics_file", outputs / "m.json")  # fmt: skip
        assert tested.returncode == 0, tested.stderr[-3000:]
        assert confusion_total(outputs) == 600  # each of test_path's rows once over the processes
        accuracies[name] = json.loads((outputs / "m.json").read_text())["test_acc"]
    assert accuracies["streamed on two processes"] == pytest.approx(accuracies["read whole"], abs=1e-6)
    assert json.loads((tmp_path / "fit.json").read_text())["test_acc"] == pytest.approx(accuracies["read whole"])
