"""A table past `data.init_args.memory_budget_mb`, streamed rather than read whole (datamodules/table.py decides from
the source's size before reading it, and hands its split and batches to a TableStream): the same table task, in memory
bounded by the row groups being read.

    python -m scripts.train fit --config configs/table.yaml --data.init_args.csv_path lake/big/ \\
        --data.init_args.label outcome --data.init_args.memory_budget_mb 256 --data.init_args.num_workers 2

pyarrow.dataset reads the Parquet files (the folders, globs, hive partitions, MLTables and Delta tables of
datamodules/table_sources.py: a Delta table's files now, their partition values as columns) one row group at a time;
a CSV is first copied once into Parquet under the system's temporary folder (typed as the in-memory CSV is, its rows
hashed from their text: datamodules/table_csv_copy.py; said on stderr, reused while the CSV is unchanged). A
test_path table streams beside it (datamodules/table_test_path.py). One pass over every row group (`scan`), in
every process alike, then gives:
- each row's split by the same rule as in memory (base.row_hashes' hashes of the same cells, from Arrow:
  table_stream_hash.py; base.split_rows), kept on disk as one byte a row (a temporary folder, deleted at exit), so
  that the epochs read each row's split rather than hash it;
- the class names (the label column's distinct values, as class_labels names them);
- the identity: the split's rule, the schema, each split's row count and a digest of the rows' hashes that is a sum
  (order-free, in constant memory), so not the in-memory one's: a streamed checkpoint is compared with a streamed
  table (`split_check` counts no rows added or removed: no row's hash is kept);
- a sample of the training split: its SAMPLE_ROWS rows (table_stream_scan.py) of the smallest (seeded) hash, the
  same whatever the files' order; the column kinds, categories, medians and scaling come from it (describe_columns,
  as in memory), so a training split of at most that many rows is described exactly as in memory.
The epochs then read each process's and each DataLoader worker's share of row groups (table_stream_batches.py).
"""

from __future__ import annotations

import shutil
import sys
import tempfile
import weakref
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.dataset as ds

from datamodules import base
from datamodules.errors import DataError
from datamodules.preprocessing import table as preprocessing
from datamodules.table_stream_batches import CODES, EpochLoader, StreamedRows, check_every_process_has_rows, plan


def open_dataset(path: str, as_text: frozenset[str] = frozenset()) -> tuple[ds.Dataset, list]:
    """The table at `path` as a pyarrow dataset (a CSV's through its Parquet copy, its columns of `as_text` kept text;
    a Delta table's of its files now and their partition values) and its row groups."""
    from datamodules.table_csv_copy import csv_copies
    from datamodules.table_sources import delta_dataset, table_files

    found = table_files(path)
    files, root = found.files, found.root
    if found.delimiter is not None:
        files, root = csv_copies(files, found.delimiter, as_text), None
    try:
        if found.fields is not None:
            dataset = delta_dataset(found, path)
        else:
            dataset = ds.dataset([str(file) for file in files], format="parquet", partitioning="hive",
                                 partition_base_dir=str(root) if root is not None else None)  # fmt: skip
        units = [unit for fragment in dataset.get_fragments() for unit in fragment.split_by_row_group()]
    except (pa.ArrowException, OSError) as error:
        raise DataError(f"{path}: not a readable Parquet dataset ({str(error).strip().splitlines()[0]})") from None
    return dataset, units


def integers_with_nulls(dataset: ds.Dataset, units: list) -> set[str]:
    """Integer columns with a missing cell anywhere: read whole, pandas makes such a column float (3 becomes 3.0, which
    hashes otherwise), so the streamed rows are made so too; not where pandas' own metadata in the files makes it a
    column of whole numbers with missing cells (Int64). From the row groups' statistics where written."""
    found, read_whole = set(), dataset.schema.empty_table().to_pandas().dtypes
    for field in dataset.schema:
        numpy_integers = isinstance(read_whole[field.name], np.dtype) and read_whole[field.name].kind in "iu"
        if numpy_integers and any(missing_cells(dataset, unit, field.name) for unit in units):
            found.add(field.name)
    return found


def missing_cells(dataset: ds.Dataset, unit, name: str) -> int:
    """Missing cells of column `name` in a row group: its statistics' count, else counted by reading the column."""
    group = unit.metadata.row_group(unit.row_groups[0].id)
    for index in range(group.num_columns):
        statistics = group.column(index).statistics
        if group.column(index).path_in_schema == name and statistics is not None and statistics.has_null_count:
            return statistics.null_count
    return unit.to_table(schema=dataset.schema, columns=[name]).column(0).null_count


class OpenedOnce:
    """A streamed table of a TableDataModule (`data`) at its option `option` (csv_path, test_path), opened once, and a
    temporary folder (deleted with this) of its rows' split codes, one .npy file a row group."""

    option, prefix = "csv_path", "table-splits-"

    def __init__(self, data) -> None:
        self.data, self.opened, self.scanned = data, None, None
        self.codes = Path(tempfile.mkdtemp(prefix=self.prefix))
        weakref.finalize(self, shutil.rmtree, self.codes, True)

    def dataset(self, state: dict | None = None) -> tuple[ds.Dataset, list]:
        """The table, opened once; read by `state`, a CSV's copy of its numbers in a column `state` reads as
        categories (a checkpoint's, test_path's training table's) keeps them text (table_csv_copy.py)."""
        from datamodules.table_csv_copy import categories_typed

        if self.opened is None:
            self.opened = open_dataset(self.data.hparams[self.option])
        if texts := categories_typed(state, self.opened[0].schema):
            return open_dataset(self.data.hparams[self.option], texts)  # its row groups those of the copy scanned
        return self.opened


class TableStream(OpenedOnce):
    """What reads a TableDataModule's table past its memory budget (datamodules/table.py makes one, and hands its
    split and batches here): the module docstring says how. `data` is the datamodule, whose options, state and
    identity these are."""

    def class_names(self) -> list[str]:
        return self.scan(None)["classes"]

    def columns(self) -> list[str]:
        """The table's columns less those of lists (set aside, as in memory), data.init_args.drop's checked."""
        schema, label, where = self.dataset()[0].schema, self.data.hparams.label, self.data.hparams.csv_path
        if label not in schema.names:
            raise DataError(f"{where}: no label column {label!r} (its columns: {', '.join(schema.names)}); give "
                            "data.init_args.label one of them")  # fmt: skip
        nested = (pa.types.is_list, pa.types.is_large_list, pa.types.is_struct, pa.types.is_map)
        self.data.check_drop(schema.names, where, label)
        for field in schema:
            if any(kind(field.type) for kind in nested):
                self.data.set_aside[field.name] = (
                    "lists, not one value a cell (give one number or text a cell to use it)"
                )
        return [name for name in schema.names if not any(kind(schema.field(name).type) for kind in nested)]

    def config_rule(self, columns: list[str]) -> dict:
        options = self.data.hparams
        if options.id_column is not None and options.id_column not in columns:
            raise DataError(f"{options.csv_path}: no column {options.id_column!r}; give data.init_args.id_column "
                            "one of its columns")  # fmt: skip
        keys = [options.id_column] if options.id_column is not None else columns
        test_fraction = 0.0 if options.test_path else options.test_fraction  # test_path's rows are the test split
        return base.split_rule(self.data.seed, options.val_fraction, test_fraction, keys, options.id_column)

    def scan(self, rule: dict | None) -> dict:
        """The one pass (module docstring) by `rule` (None: the config's), remembered for that rule."""
        columns, options = self.columns(), self.data.hparams
        rule = rule or self.config_rule(columns)
        if self.scanned and self.scanned["rule"] == rule:
            return self.scanned
        from datamodules.table_stream_scan import scan_table

        if rule["method"] != base.METHOD:
            raise DataError(f"{options.csv_path}: a checkpoint split before row-hash rules is read in memory only; "
                            "give a larger data.init_args.memory_budget_mb")  # fmt: skip
        dataset, units = self.dataset()
        self.scanned = scan_table(dataset, units, columns, options.label, rule, self.codes, str(options.csv_path),
                                  integers_with_nulls(dataset, units))  # fmt: skip
        self.scanned["rule"] = rule
        return self.scanned

    def split(self, rule: dict | None = None) -> None:
        """The datamodule's state (the column kinds and statistics of the sample) and identity, by `rule`."""
        data, scanned = self.data, self.scan(rule)
        label, where, rule = data.hparams.label, str(data.hparams.csv_path), scanned["rule"]
        unknown = [name for name in scanned["classes"] if name not in data.class_names]
        if unknown:
            raise DataError(f"{where}: label {unknown[0]!r} is not one of the checkpoint's classes {data.class_names}; "
                            "give the data it was trained on")  # fmt: skip
        rows = {name: sum(counts[name] for counts in scanned["counts"]) for name in CODES}
        total = sum(rows.values())
        if len(scanned["classes"]) * 2 > total:
            raise DataError(f"{where}: label column {label!r} has {len(scanned['classes'])} classes in {total} rows; "
                            "a classifier needs several rows of each class: give the column of each row's class as "
                            "data.init_args.label")  # fmt: skip
        if rows["test"] == 0 and not data.test_stream:
            raise DataError(f"{where}: {total} rows leave no test rows at test_fraction {data.hparams.test_fraction}; "
                            "give more rows or a larger data.init_args.test_fraction")  # fmt: skip
        sample = scanned["sample"].drop(columns=[rule["id_column"]] if rule["id_column"] else [])
        data.state = preprocessing.describe_columns(sample, label, where, data.set_aside)
        if data.trainer is None or data.trainer.is_global_zero:
            print("\n".join(preprocessing.column_lines(where, data.state, [])), file=sys.stderr)
            print(f"{where}: streamed ({total} rows in {len(scanned['counts'])} row groups, past "
                  f"data.init_args.memory_budget_mb {data.hparams.memory_budget_mb}); column kinds and statistics of "
                  f"{len(scanned['sample'])} of its {rows['train']} training rows", file=sys.stderr)  # fmt: skip
        schema = {column: "left out" for column in scanned["columns"]} | {label: "label"}
        schema |= {column["name"]: column["kind"] for column in data.state["columns"]}
        splits = {name: {"digest": scanned["digests"][name], "rows": rows[name]} for name in CODES}
        if data.test_stream:  # test_path's rows are the test split
            splits["test"] = data.test_stream.identity(scanned["columns"])
        data.identity = {"source": where, "digest": scanned["digests"]["all"], "rows": total, "split": rule,
                         "schema": schema, "splits": splits, "streamed": True}  # fmt: skip

    def labels(self) -> tuple[pa.Array, np.ndarray]:
        """The label column's values and each one's class index (of class_names: the checkpoint's, once restored)."""
        scanned = self.scan(self.data.identity["split"])
        index = {name: i for i, name in enumerate(self.data.class_names)}
        return scanned["label_values"], np.array([index[name] for name in scanned["label_names"]], dtype=np.int64)

    def loader(self, split: str) -> EpochLoader:
        """The DataLoader of `split`'s rows this process reads: its share of row groups, its workers' parts of it."""
        data, scanned = self.data, self.scan(self.data.identity["split"])
        dataset, units = self.dataset(data.state)
        rank, world_size = data.rank_and_world_size
        workers = data.hparams.num_workers
        counts = [unit[split] for unit in scanned["counts"]]
        planned = plan(counts, world_size, max(1, workers), data.batch_size, pad=split == "train")
        if split != "train":
            check_every_process_has_rows(split, planned, sum(1 for count in counts if count))
        rows = StreamedRows(units, dataset.schema, self.codes, split, data.state, self.labels(), planned[rank],
                            data.batch_size, split == "train", data.seed, rank)  # fmt: skip
        return EpochLoader(rows, lambda: data.trainer.current_epoch if data.trainer else None, workers)
