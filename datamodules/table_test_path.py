"""A `test_path` table streamed rather than read whole: past data.init_args.memory_budget_mb by its own estimate, or
whenever the training table streams (datamodules/table.py decides, and hands its test batches here). Its own pyarrow
dataset (a file, folder, glob, MLTable or Delta table, as datamodules/table_stream.py opens csv_path), every row a
test row, read row group by row group: each process its share and each row once over the processes, so the test
metrics are exact under DDP, as the streamed test split's are.

    python -m scripts.train test --config configs/table.yaml --ckpt_path CKPT --data.init_args.csv_path lake/train/ \\
        --data.init_args.test_path lake/test/ --data.init_args.label outcome --data.init_args.memory_budget_mb 256

One pass over its row groups gives the label's values and each one's class (one of the training table's), the rows,
and a digest of their hashes that is a sum (as the streamed splits' are), kept as the identity's test split; each row
group's rows are marked test on disk (a byte a row, deleted at exit) for the batches of table_stream_batches.py.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from datamodules.errors import DataError
from datamodules.table_stream import OpenedOnce, integers_with_nulls
from datamodules.table_stream_batches import CODES, EpochLoader, StreamedRows, check_every_process_has_rows, plan
from datamodules.table_stream_hash import pandas_integers, row_hashes
from datamodules.table_stream_scan import Digests, class_names_of, label_texts


class StreamedTestPath(OpenedOnce):
    """What reads a TableDataModule's `test_path` streamed; `data` is the datamodule, whose options, classes and
    column state these are."""

    option, prefix = "test_path", "table-test-rows-"

    def scan(self, columns: list[str]) -> dict:
        """The one pass (module docstring) over the training table's `columns`, once."""
        if self.scanned is not None:
            return self.scanned
        (dataset, units), options = self.dataset(), self.data.hparams
        path, label = str(options.test_path), options.label
        if absent := [column for column in columns if column not in dataset.schema.names]:
            raise DataError(f"{path}: no column {absent[0]!r} of {options.csv_path}; give "
                            "data.init_args.test_path a table of the training table's columns")  # fmt: skip
        floats = integers_with_nulls(dataset, units) & set(columns)  # as the training table's are (table_stream.py)
        texts, counts, digests = {}, [], Digests()
        for index, unit in enumerate(units):
            table = unit.to_table(schema=dataset.schema, columns=columns)
            for name in floats:
                table = table.set_column(columns.index(name), name, table.column(name).cast(pa.float64()))
            texts.update(label_texts(table.column(label), unit, path, label))
            digests.add("test", row_hashes(table, pandas_integers(table.schema)))  # base.row_hashes' own
            np.save(self.codes / f"{index}.npy", np.full(table.num_rows, CODES["test"], dtype=np.uint8))
            counts.append(table.num_rows)
        names, _ = class_names_of(set(texts.values()), path, label)
        classes = {name: i for i, name in enumerate(self.data.class_names)}
        if unknown := next((names[text] for text in texts.values() if names[text] not in classes), None):
            raise DataError(f"{path}: label {unknown!r} is no class of {options.csv_path} ({', '.join(classes)}); "
                            "give test rows of the training table's classes")  # fmt: skip
        values = list(texts)
        indices = np.array([classes[names[texts[value]]] for value in values], dtype=np.int64)
        self.scanned = {"counts": counts, "digest": digests.digests()["test"],
                        "labels": (pa.array(values, dataset.schema.field(label).type), indices)}  # fmt: skip
        return self.scanned

    def identity(self, columns: list[str]) -> dict:
        """The identity's test split: its digest (a sum, as a streamed split's), rows and source."""
        scanned = self.scan(columns)
        return {"digest": scanned["digest"], "rows": sum(scanned["counts"]), "source": str(self.data.hparams.test_path)}

    def loader(self) -> EpochLoader:
        """The DataLoader of the test rows this process reads: its share of row groups, its workers' parts of it."""
        if self.scanned is None:
            raise DataError("test_path: the datamodule was not set up; call setup('test') first")
        data, (dataset, units) = self.data, self.dataset(self.data.state)
        rank, world_size = data.rank_and_world_size
        counts, workers = self.scanned["counts"], data.hparams.num_workers
        planned = plan(counts, world_size, max(1, workers), data.batch_size, pad=False)
        check_every_process_has_rows("test", planned, sum(1 for count in counts if count))
        rows = StreamedRows(units, dataset.schema, self.codes, "test", data.state, self.scanned["labels"],
                            planned[rank], data.batch_size, False, data.seed, rank)  # fmt: skip
        return EpochLoader(rows, lambda: None, workers)
