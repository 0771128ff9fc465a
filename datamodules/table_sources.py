"""Tables of many files, as a lakehouse keeps them: a folder of Parquet part files as Spark writes it (its `_SUCCESS`,
`_committed_*` and `.crc` files ignored), a hive-partitioned folder (`year=2024/part-0.parquet`: the partition
columns become columns), a glob (`data/part-*.parquet`, `exports/*.csv`), an MLTable whose paths are files, folders
or patterns, a Delta table's folder (its `_delta_log` says which files are the table now), and an Azure ML
`uri_folder` input holding any of these. datamodules/table.py reads one file itself and comes here for the rest.

    python -m scripts.train fit --config configs/table.yaml --data.init_args.csv_path lake/penguins/ \
        --data.init_args.label species

pyarrow reads the Parquet files (pyarrow.dataset's file discovery and hive partitions); the Delta log is read here
(JSON commits and Parquet checkpoints, a few dozen lines) rather than with the deltalake package, which a plain fit
would then need. `table_files` names the files of any of these (and `delta_dataset` makes a Delta table's a pyarrow
dataset) for the size estimate and the streamed read (datamodules/table_stream.py); `read_source` reads them whole.
"""

from __future__ import annotations

import glob
import json
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import unquote

from datamodules.errors import DataError

CSV_SUFFIXES = {".csv": ",", ".tsv": "\t", ".txt": ","}  # as datamodules/table.py reads one file
PARQUET_SUFFIXES = (".parquet", ".pq")

IGNORED_PREFIXES = ("_", ".")  # Spark's _SUCCESS, _committed_*, _started_*, .crc files; hidden files
DELTA_TYPES = {"string": "string", "long": "int64", "integer": "int32", "short": "int16", "byte": "int8",
               "double": "float64", "float": "float32", "boolean": "bool", "date": "date32"}  # fmt: skip


@dataclass
class TableFiles:
    """The files of a table: `root` the folder hive partitions are read under, `delimiter` None for Parquet or the
    CSV files' delimiter; a Delta table's also each file's partition values and its schema's fields (name: type)."""

    files: list[Path]
    root: Path | None = None
    delimiter: str | None = None
    partitions: dict[Path, dict] = field(default_factory=dict)
    fields: dict[str, str] | None = None


def table_files(path: str, option: str = "csv_path") -> TableFiles:
    """The files of the table at `path` (a file, folder, glob, MLTable or Delta table), none read; a DataError (one
    line, naming data.init_args.`option`) where there are none or they are not of one format."""
    source = Path(path)
    if source.is_file():
        return TableFiles([source], None, kind_of([source], path)[1])
    if not source.exists():
        files = [Path(name) for name in sorted(glob.glob(path, recursive=True)) if Path(name).is_file()]
        if not files:
            raise DataError(f"{path}: no file matches it; give data.init_args.{option} a file, folder or glob that "
                            "names the table's files")  # fmt: skip
        return TableFiles(files, None, kind_of(files, path)[1])
    if (source / "MLTable").is_file():
        return mltable_files(source)
    if (source / "_delta_log").is_dir():
        return delta_files(source, path)
    files = data_files(source)
    if not files:
        raise DataError(f"{path}: a folder without data files (CSV or Parquet, an MLTable file or a Delta table's "
                        "_delta_log); give the folder that holds the table")  # fmt: skip
    return TableFiles(files, source, kind_of(files, path)[1])


def data_files(folder: Path) -> list[Path]:
    """The files under `folder` (every level) that hold rows, in name order: none whose name, or a folder's on the
    way, starts with `_` or `.`, nor an MLTable file."""
    found = []
    for path in sorted(folder.rglob("*")):
        parts = path.relative_to(folder).parts
        if path.is_file() and path.name != "MLTable" and not any(part.startswith(IGNORED_PREFIXES) for part in parts):
            found.append(path)
    return found


def kind_of(files: list[Path], where: str) -> tuple[str, str | None]:
    """ "parquet" or "csv" (with its delimiter) for files all of one format; else one line naming the odd ones."""
    kinds = {}
    for path in files:
        suffix = path.suffix.lower()
        if suffix in PARQUET_SUFFIXES or (suffix not in CSV_SUFFIXES and first_bytes(path) == b"PAR1"):
            kinds[path] = ("parquet", None)
        elif suffix in CSV_SUFFIXES:
            kinds[path] = ("csv", CSV_SUFFIXES[suffix])
        else:
            raise DataError(f"{where}: {path} is neither a CSV (.csv, .tsv) nor a Parquet file; leave it out of it")
    found = set(kinds.values())
    if len(found) > 1:
        raise DataError(f"{where}: holds both CSV and Parquet files ({', '.join(sorted(f'{k}' for k, _ in found))}); "
                        "give a folder, glob or MLTable of one format")  # fmt: skip
    return found.pop()


def first_bytes(path: Path) -> bytes:
    with path.open("rb") as file:
        return file.read(4)


def read_source(path: str, option: str, read_file):
    """A folder, glob or MLTable of many files as one DataFrame and a function naming its rows ("part-1.parquet row
    3"). `read_file(path, delimiter)` reads one file as datamodules/table.py does (delimiter None: Parquet)."""
    source = Path(path)
    if (source / "MLTable").is_file():
        return read_mltable(source, read_file)
    if (source / "_delta_log").is_dir():
        return read_delta(source, path)
    found = table_files(path, option)
    return read_files(found.files, path, read_file, found.root)


def read_files(files: list[Path], where: str, read_file, root: Path | None):
    """Files of one format as one table: Parquet through pyarrow.dataset (hive partitions under `root` become
    columns), CSV files one by one, each with the same columns."""
    import pandas as pd

    kind, delimiter = kind_of(files, where)
    if kind == "parquet":
        return read_parquet_files(files, where, root)
    frames, names = [], []
    for path in files:
        frame, row_name = read_file(str(path), delimiter)
        if frames and list(frame.columns) != list(frames[0].columns):
            raise DataError(f"{where}: {path} has columns {list(frame.columns)}, {files[0]} {list(frames[0].columns)}; "
                            "give files of the same columns")  # fmt: skip
        frames.append(frame)
        names.append((path.name, row_name))
    from datamodules.table_csv import same_kinds

    return pd.concat(same_kinds(frames), ignore_index=True), row_names(names, [len(frame) for frame in frames])


def row_names(files: list[tuple[str, object]], counts: list[int]):
    """Names the i-th row of files read one after another by its file and its own name there."""
    import bisect
    import itertools

    starts = list(itertools.accumulate([0, *counts]))

    def name(index: int) -> str:
        file = bisect.bisect_right(starts, index) - 1
        file_name, row_name = files[file]
        return f"{file_name} {row_name(index - starts[file])}"

    return name


def read_parquet_files(files: list[Path], where: str, root: Path | None):
    import pyarrow as pa
    import pyarrow.dataset as ds

    try:
        dataset = ds.dataset([str(path) for path in files], format="parquet", partitioning="hive",
                             partition_base_dir=str(root) if root is not None else None)  # fmt: skip
        table = dataset.to_table()
    except (pa.ArrowException, OSError) as error:
        raise DataError(f"{where}: not a readable Parquet dataset ({first_line(error)})") from None
    counts = [fragment.count_rows() for fragment in dataset.get_fragments()]
    names = [(Path(fragment.path).name, lambda index: f"row {index + 1}") for fragment in dataset.get_fragments()]
    return table.to_pandas(), row_names(names, counts)


def first_line(error: BaseException) -> str:
    return (str(error).strip().splitlines() or [type(error).__name__])[0]


def read_mltable(folder: Path, read_file):
    """An MLTable's files read whole, as `mltable_files` names them."""
    where = str(folder / "MLTable")
    found = mltable_files(folder)
    if found.fields is not None:
        return read_delta(found.root, where)
    if found.delimiter is None:
        return read_parquet_files(found.files, where, found.root)
    return read_files(found.files, where, lambda path, _: read_file(path, found.delimiter), None)


def mltable_files(folder: Path) -> TableFiles:
    """An MLTable's paths (`file:`, `folder:`, `pattern:`, relative to its folder) as its transformation says:
    read_parquet, read_delimited (its delimiter) or read_delta_lake (the Delta table's files, its folder the root)."""
    import yaml

    spec_path = folder / "MLTable"
    try:
        spec = yaml.safe_load(spec_path.read_text()) or {}
    except (yaml.YAMLError, UnicodeDecodeError) as error:
        raise DataError(f"{spec_path}: not readable YAML ({str(error).splitlines()[0]})") from None
    entries = [entry for entry in spec.get("paths") or [] if isinstance(entry, dict)]
    if not entries:
        raise DataError(f"{spec_path}: no paths; name the table's file:, folder: or pattern: beside it")
    delimiter, delta = None, False
    for step in spec.get("transformations") or []:
        if isinstance(step, dict) and isinstance(step.get("read_delimited"), dict):
            delimiter = step["read_delimited"].get("delimiter", ",")
        elif isinstance(step, dict) and "read_delimited" in step:
            delimiter = ","
        elif isinstance(step, dict) and "read_delta_lake" in step:
            delta = True
    files: list[Path] = []
    for entry in entries:
        (key, value), *_ = entry.items()
        if not isinstance(value, str) or "://" in value:
            raise DataError(f"{spec_path}: its path {value!r} is not on this machine; the table task reads an "
                            "MLTable's paths beside it (an Azure ML job mounts them there)")  # fmt: skip
        if delta:
            return delta_files(folder / value, str(spec_path))
        if key == "file":
            if not (folder / value).is_file():
                raise DataError(f"{spec_path}: names {folder / value}, which is not there; put the file beside it")
            files.append(folder / value)
        elif key == "folder":
            files += data_files(folder / value)
        elif key == "pattern":
            files += [Path(name) for name in sorted(glob.glob(str(folder / value), recursive=True))
                      if Path(name).is_file()]  # fmt: skip
        else:
            raise DataError(f"{spec_path}: a path of kind {key!r}; give file:, folder: or pattern:")
    if not files:
        raise DataError(f"{spec_path}: its paths name no file; put the table's files beside it")
    if delimiter is None and not spec.get("transformations"):
        delimiter = kind_of(files, str(spec_path))[1]
    if delimiter is not None:
        return TableFiles(files, None, delimiter)
    folders = [folder / entry["folder"] for entry in entries if "folder" in entry]
    return TableFiles(files, folders[0] if len(entries) == len(folders) == 1 else None, None)


def delta_actions(log: Path, where: str) -> tuple[dict[str, dict], dict]:
    """The files a Delta table holds now (path -> their add action) and its metadata: its newest checkpoint, if any,
    then each JSON commit after it, in version order."""
    files: dict[str, dict] = {}
    metadata: dict = {}
    start = -1
    last = log / "_last_checkpoint"
    if last.is_file():
        import pyarrow.parquet as pq

        start = json.loads(last.read_text())["version"]
        for part in sorted(log.glob(f"{start:020d}.checkpoint*.parquet")):
            for row in pq.read_table(part).to_pylist():
                apply_action(row, files, metadata)
    commits = sorted((int(path.name.split(".")[0]), path) for path in log.glob("*.json") if path.stem.isdigit())
    for version, path in commits:
        if version > start:
            for line in path.read_text().splitlines():
                if line.strip():
                    apply_action(json.loads(line), files, metadata)
    if not metadata:
        raise DataError(f"{where}: its _delta_log has no commit with the table's metadata; give a Delta table's folder")
    return files, metadata


def apply_action(action: dict, files: dict[str, dict], metadata: dict) -> None:
    if action.get("add"):
        if action["add"].get("deletionVector"):
            raise DataError("a Delta table with deletion vectors; rewrite it without them (OPTIMIZE ... or "
                            "delta.enableDeletionVectors = false) or export it as Parquet")  # fmt: skip
        add = dict(action["add"])
        if isinstance(add.get("partitionValues"), list):  # a checkpoint's map, as pyarrow reads it: (key, value) pairs
            add["partitionValues"] = dict(add["partitionValues"])
        files[unquote(add["path"])] = add
    elif action.get("remove"):
        files.pop(unquote(action["remove"]["path"]), None)
    elif action.get("metaData"):
        metadata.update(action["metaData"])


def plain_strings(table):
    """`table` with its text columns as one type: writers differ (string, large_string, string_view), and tables of
    several files are concatenated."""
    return table.cast(large_strings(table.schema))


def delta_files(folder: Path, where: str) -> TableFiles:
    """The Parquet files a Delta table at `folder` holds now, each one's partition values, and its schema's fields
    (name: Delta type, in the table's order)."""
    files, metadata = delta_actions(folder / "_delta_log", where)
    if (metadata.get("configuration") or {}).get("delta.columnMapping.mode", "none") != "none":
        raise DataError(f"{where}: a Delta table with column mapping; export it as Parquet for the table task")
    fields = {field["name"]: field["type"] for field in json.loads(metadata["schemaString"])["fields"]}
    partitions = {folder / path: add.get("partitionValues") or {} for path, add in sorted(files.items())}
    return TableFiles(list(partitions), folder, None, partitions, fields)


def large_strings(schema):
    """`schema` with its text fields of one type: writers differ (string, large_string, string_view)."""
    import pyarrow as pa

    text = (pa.types.is_string, pa.types.is_large_string, pa.types.is_string_view)
    return pa.schema([field.with_type(pa.large_string()) if any(kind(field.type) for kind in text) else field
                      for field in schema])  # fmt: skip


def delta_dataset(found: TableFiles, where: str):
    """A Delta table's files (`delta_files`) as one pyarrow dataset of the table's columns in its order, as `read_delta`
    reads them: each file's partition values its columns' values (typed as the schema says), text as large_string."""
    import pyarrow as pa
    import pyarrow.dataset as ds
    import pyarrow.parquet as pq
    from pyarrow.fs import LocalFileSystem

    try:
        stored = pa.unify_schemas([large_strings(pq.read_schema(path)) for path in found.files],
                                  promote_options="permissive")  # fmt: skip
    except (pa.ArrowException, OSError) as error:
        raise DataError(f"{where}: its files are not readable as one table ({first_line(error)})") from None
    kinds = {}
    for name, kind in found.fields.items():  # a column in no file (a partition column, one added later): the schema's
        kinds[name] = (
            stored.field(name).type if name in stored.names else pa.type_for_alias(DELTA_TYPES.get(kind, "string"))
        )
    kinds = {name: pa.large_string() if kind == pa.string() else kind for name, kind in kinds.items()}
    expressions = []
    for path in found.files:
        expression = ds.scalar(True)
        for column, value in found.partitions[path].items():
            given = ds.field(column) == pa.scalar(value).cast(kinds[column]) if value is not None else None
            expression = expression & (ds.field(column).is_null() if given is None else given)
        expressions.append(expression)
    schema = pa.schema([pa.field(name, kind) for name, kind in kinds.items()])
    return ds.FileSystemDataset.from_paths([str(path) for path in found.files], schema=schema,
                                           format=ds.ParquetFileFormat(), filesystem=LocalFileSystem(),
                                           partitions=expressions)  # fmt: skip


def read_delta(folder: Path, where: str):
    """The Delta table at `folder` as it is now: its live Parquet files, each with its partition values as columns
    (typed as the table's schema says)."""
    import pandas as pd
    import pyarrow as pa
    import pyarrow.parquet as pq

    found = delta_files(folder, where)
    fields = found.fields
    tables, names = [], []
    for path, values in found.partitions.items():
        try:
            table = pq.read_table(path)
        except (pa.ArrowException, OSError) as error:
            raise DataError(
                f"{where}: its file {path.relative_to(folder)} is not readable ({first_line(error)})"
            ) from None
        for column, value in values.items():
            kind = DELTA_TYPES.get(fields.get(column), "string")
            values = pa.array([value] * len(table), pa.string())
            table = table.append_column(column, values.cast(kind) if value is not None else values)
        tables.append(plain_strings(table))
        names.append((path.name, lambda index: f"row {index + 1}"))
    if not tables:
        return pd.DataFrame(columns=list(fields)), lambda index: f"row {index + 1}"
    whole = pa.concat_tables(tables, promote_options="default").select(list(fields))
    return whole.to_pandas(), row_names(names, [len(table) for table in tables])
