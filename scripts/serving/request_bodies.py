"""The bodies of the scoring script's requests (scripts/score.py) decoded into rows and images: JSON in every form
the runtimes of MLflow models and Azure ML send, CSV (checked as predict checks a CSV), multipart forms, each read up
to a limit; what cannot be an input is a RequestError naming the culprit (a 4xx).

scripts/score.py loads this file by its path (`repo_module`), as it loads the model's preprocessing: the inference
server puts the registered model's own copy of `scripts` and `datamodules` first on sys.path, so nothing here imports
a module of this repository by its package name. Standard library at the top; pandas and werkzeug where needed.
"""

from __future__ import annotations

import binascii
import csv
import io
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
MAX_JSON_DEPTH = 32  # rows are objects in a list, images a list in an object: anything deeper is not an input


class RequestError(Exception):
    """A request the model cannot answer; `status` is its HTTP status (4xx), the message names the culprit."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


def form_files(request, limit: int, too_large: str) -> list[tuple[str, bytes]]:
    """A multipart form's files; a form sent chunked (no Content-Length) is read up to `limit` bytes only."""
    from werkzeug.exceptions import RequestEntityTooLarge

    request.max_content_length = limit  # werkzeug's and Flask's requests stop reading the stream there
    try:
        return [(file.filename or field, file.read()) for field, file in request.files.items(multi=True)]
    except RequestEntityTooLarge:
        raise RequestError(f"request body of more than {limit} bytes is too large; {too_large}", 413) from None


def body_of(request, limit: int, too_large: str = "send less") -> bytes:
    """The body, read up to `limit` bytes: a longer one (chunked, with no Content-Length) is refused unread."""
    stream, parts, size = request.stream, [], 0
    while size <= limit:
        part = stream.read(min(2**20, limit + 1 - size))
        if not part:
            break
        parts.append(part)
        size += len(part)
    if size > limit:
        raise RequestError(f"request body of more than {limit} bytes is too large; {too_large}", 413)
    body = b"".join(parts)
    if not body:
        raise RequestError("empty request body: send the input (rows as JSON or CSV, or images)")
    return body


def json_int(text: str) -> int | float:
    """A JSON integer; one past float's range (JSON sets none) as float's infinity, which pandas can hold and the row
    check refuses as it refuses 1e400."""
    number = int(text)
    return number if abs(number) <= sys.float_info.max else float(text)


ROWS_FIX = "send JSON rows (Content-Type: application/json)"
IMAGES_FIX = 'send images as JSON {"images": [base64, ...]} (or multipart files)'


def json_body(body: bytes, fix: str = ROWS_FIX):
    """The JSON of `body`; not JSON, or nested past MAX_JSON_DEPTH, is refused naming what is wrong and `fix`."""
    try:
        given = json.loads(body, parse_int=json_int)
    except RecursionError:
        given = TOO_DEEP  # nested past Python's recursion limit: refused below as any too-deep JSON
    except (UnicodeDecodeError, ValueError) as error:
        raise RequestError(f"request body is not valid JSON ({error}); {fix}") from None
    if given is TOO_DEEP or depth(given) > MAX_JSON_DEPTH:
        raise RequestError(
            f"request body is JSON nested deeper than {MAX_JSON_DEPTH} levels; send JSON rows as objects of strings "
            'and numbers, or images as {"images": [base64, ...]}'
        )
    return given


TOO_DEEP = object()


def depth(value, limit: int = MAX_JSON_DEPTH) -> int:
    """How deep lists and objects nest in `value` (a number or string: 0), counted to just past `limit`."""
    level, layer = 0, [value]
    while level <= limit:
        containers = [item for item in layer if isinstance(item, list | dict)]
        if not containers:
            break
        level += 1
        layer = [v for item in containers for v in (item.values() if isinstance(item, dict) else item)]
    return level


SPLIT_KEYS = ("input_data", "dataframe_split")  # Azure ML's no-code request, `mlflow models serve`'s


def input_data(given):
    """Azure ML's no-code MLflow request, {"input_data": {"columns": [...], "index": [...], "data": [[...], ...]}}
    (a DataFrame in pandas' split orientation), or `mlflow models serve`'s {"dataframe_split": ...}, as a DataFrame;
    None for any other JSON."""
    key = next((key for key in SPLIT_KEYS if isinstance(given, dict) and key in given), None)
    if key is None:
        return None
    import pandas as pd

    split = given[key]
    # Column names pandas takes but the model cannot: a list (unhashable) fails deep in it, a name given twice makes
    # that column a DataFrame.
    columns = split.get("columns") if isinstance(split, dict) else None
    names = isinstance(columns, list) and all(isinstance(column, str) for column in columns)
    seen: set[str] = set()
    for column in columns if names else ():
        if column in seen:
            raise RequestError(f'{key}: column {column!r} named twice in "columns"; name each once')
        seen.add(column)
    try:
        if not (isinstance(split, dict) and isinstance(split.get("data"), list) and split["data"]):
            raise ValueError("no data")
        if columns is not None and not names:
            raise ValueError("columns that are not names")
        frame = pd.DataFrame(split["data"], columns=split.get("columns"), index=split.get("index"))
        return frame.reset_index(drop=True)
    except (ValueError, TypeError, AssertionError):
        raise RequestError(
            f'{key}: send a DataFrame in pandas\' split orientation: {{"{key}": {{"columns": [...], "data": '
            "[[...], ...]}}, one list per row"
        ) from None


RECORD_KEYS = ("dataframe_records", "instances", "inputs")  # `mlflow models serve`'s requests of rows as objects


def mlflow_records(given) -> tuple[str, object] | None:
    """(key, its rows) of `mlflow models serve`'s {"dataframe_records": [...]}, {"instances": [...]} or {"inputs":
    [...]} (rows as objects), or {"inputs": {column: [values]}} (a column of values each, as rows); None for any other
    JSON. A client of MLflow's server sent `instances` or `inputs` here and was told of missing columns."""
    key = next((key for key in RECORD_KEYS if isinstance(given, dict) and key in given), None)
    if key is None or (key != "dataframe_records" and set(given) - {key, "params"}):  # a row with such a field
        return None
    rows = given[key]
    columns = key == "inputs" and isinstance(rows, dict) and rows and all(isinstance(v, list) for v in rows.values())
    if columns and len({len(values) for values in rows.values()}) == 1:
        rows = [dict(zip(rows, values)) for values in zip(*rows.values())]
    return key, rows


def json_rows(body: bytes, read: set[str] | None, max_rows: int):
    """JSON rows: an object, a list of objects, Azure ML's {"input_data": ...} or `mlflow models serve`'s
    {"dataframe_split": ...}, {"dataframe_records": [...]}, {"instances": [...]} or {"inputs": ...}. A field of the
    columns the model reads (`read`; None: every field) must be a string, a number or null; the others are ignored, as
    every other runtime ignores them."""
    rows = json_body(body)
    frame = input_data(rows)
    if frame is not None:
        return frame
    if (records := mlflow_records(rows)) is not None:  # taken as a row, its name was the field refused
        rows = records[1]
    rows = [rows] if isinstance(rows, dict) else rows
    if not isinstance(rows, list) or not rows or not all(isinstance(row, dict) for row in rows):
        raise RequestError("send one row as a JSON object, or several as a non-empty list of objects")
    if len(rows) > max_rows:
        raise RequestError(f"{len(rows)} rows in one request; send at most {max_rows} (SCORE_MAX_ROWS)", 413)
    for i, row in enumerate(rows):
        for field, value in row.items():
            if read is not None and field not in read:
                continue
            if isinstance(value, bool) or not isinstance(value, str | int | float | type(None)):
                kind = {list: "a list", dict: "an object", bool: "true/false"}[type(value)]
                raise RequestError(
                    f"row {i + 1}, field {field!r}: {kind} ({json.dumps(value)[:40]}); send each field as one JSON "
                    "string or number"
                )
    return rows


def repo_module(relative: str):
    """A torch-free module of this repository as deployed with the scoring script, loaded by its path (once), under a
    name of its own: the server puts the model's own code first on sys.path (MLflow's code_paths), and a model
    registered before a module existed ships a copy without it, where `import datamodules.preprocessing.penguins`
    fails. A module of another name in datamodules/ would not help: the package is the model's copy there, which has no
    such module (and a model registered with one would ship it, and shadow this script's again)."""
    import importlib.util

    name = "_score_" + relative.removesuffix(".py").replace("/", "_")
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, REPO / relative)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        sys.modules[name] = module
    return sys.modules[name]


CSV_OF_ROWS = "a CSV of rows in the data's column names"  # any rows model's: a table's as a penguin one's


def csv_checks():
    """datamodules/preprocessing/csv_files.py's CSV checks, predict's own (repo_module)."""
    return repo_module("datamodules/preprocessing/csv_files.py")


def csv_rows(body: bytes, where: str, max_rows: int | None):
    """A CSV's rows as a DataFrame, read as predict reads a CSV: its layout checked by the same code
    (datamodules/preprocessing/csv_files.py, which the model ships: columns separated by semicolons, a column the model
    reads named twice, a row with more values than the header; UTF-16 and a workbook named as such), so that the
    endpoint refuses what predict refuses, in the same words, rather than as 'missing columns' or a parser's reason.
    Empty fields past the header's (a trailing comma on each row) are dropped; row i is line i + 2 of the body, blank
    lines counted. At most `max_rows` rows (None: no limit). The checks are loaded here, not at the top: this script
    imports nothing of the model's code until a CSV comes."""
    import warnings

    import pandas as pd

    checks = csv_checks()
    check_csv_layout, drop_blank_rows, not_utf8 = checks.check_csv_layout, checks.drop_blank_rows, checks.not_utf8
    if what := not_utf8(body[:4]):
        raise RequestError(f"{where} is not a readable CSV (not UTF-8 text): {what}")
    try:
        text = body.decode("utf-8-sig")
    except UnicodeDecodeError:
        raise RequestError(f"{where} is not a readable CSV (not UTF-8 text); send {CSV_OF_ROWS}") from None
    columns = repo_module("datamodules/preprocessing/penguins.py").SCHEMA_COLUMNS  # a column it reads named twice
    try:
        header, header_line, rows = check_csv_layout(csv.reader(io.StringIO(text, newline="")), where, columns)
    except csv.Error as error:
        raise RequestError(f"{where} is not a readable CSV ({error}); send {CSV_OF_ROWS}") from None
    except checks.DataError as error:
        raise RequestError(str(error)) from None
    if not header:
        raise RequestError(f"{where} is empty: send a CSV whose first line names the columns, one row a line")
    if max_rows is not None and rows > max_rows:
        raise RequestError(f"{rows} rows in one request; send at most {max_rows} (SCORE_MAX_ROWS)", 413)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "Length of header ... does not match": the empty trailing fields, checked
        try:
            frame = pd.read_csv(io.StringIO(text), index_col=False, usecols=range(len(header)), header=0,
                                skip_blank_lines=False, skiprows=header_line - 1)  # fmt: skip
        except (pd.errors.ParserError, pd.errors.EmptyDataError, ValueError) as error:
            raise RequestError(f"{where} is not a readable CSV ({error}); send {CSV_OF_ROWS}") from None
    return drop_blank_rows(frame, header_line)


def json_images(body: bytes) -> list[tuple[str, bytes]]:
    given = json_body(body, IMAGES_FIX)
    frame = input_data(given)
    if frame is not None:
        if list(frame.columns) != ["image"]:
            key = next(key for key in SPLIT_KEYS if key in given)
            raise RequestError(f'{key}: send one column "image" holding each image as base64 text')
        given = {"images": frame["image"].tolist()}
    elif (found := mlflow_records(given)) is not None:  # mlflow models serve's
        key, records = found
        if not (isinstance(records, list) and all(isinstance(r, dict) and list(r) == ["image"] for r in records)):
            raise RequestError(f'{key}: send a list of objects {{"image": base64}}, one per image')
        given = {"images": [record["image"] for record in records]}
    if isinstance(given, dict) and isinstance(given.get("image"), str):
        encoded = [given["image"]]
    elif isinstance(given, dict) and isinstance(given.get("images"), list) and given["images"]:
        encoded = given["images"]
    else:
        raise RequestError('send images as JSON {"images": [base64, ...]} or {"image": base64}')
    # As the model reads base64 text (in lines, or a web page's data URL): this script's copy of its code (repo_module).
    base64_image = repo_module("scripts/serving/pyfunc_model.py").base64_image
    files = []
    for i, text in enumerate(encoded):
        try:
            files.append((f"image {i + 1}", base64_image(text)))
        except (binascii.Error, TypeError, ValueError):
            raise RequestError(f"image {i + 1}: not base64 text; encode each image's bytes as base64") from None
    return files
