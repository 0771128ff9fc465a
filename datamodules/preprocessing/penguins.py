"""Penguin rows as the network sees them, with pandas and numpy only: reading either CSV schema's columns, the range
check against the training split and the scaling. The datamodule (datamodules/penguins.py: fit, test, predict) and
the registered model (scripts/serving/pyfunc_model.py, which ships this file) both use it.

    python -m scripts.train predict --config configs/penguins.yaml --ckpt_path CKPT --data.predict_path new.csv
"""

from __future__ import annotations

import numpy as np

from datamodules.errors import DataError

SPECIES = ("Adelie", "Gentoo", "Chinstrap")  # the course's label order: Species 0, 1, 2
ISLANDS = ("Torgersen", "Biscoe", "Dream")  # order of first appearance in the data
FEATURES = ("island", "culmen_length", "culmen_depth", "flipper_length", "body_mass")

# Each schema's column name for each of our names; species is optional (absent at predict time).
SCHEMAS = {
    "palmerpenguins": {
        "island": "island",
        "culmen_length": "bill_length_mm",
        "culmen_depth": "bill_depth_mm",
        "flipper_length": "flipper_length_mm",
        "body_mass": "body_mass_g",
        "species": "species",
    },
    "course": {
        "island": "Island",
        "culmen_length": "CulmenLength",
        "culmen_depth": "CulmenDepth",
        "flipper_length": "FlipperLength",
        "body_mass": "BodyMass",
        "species": "Species",
    },
}
# The course's scaling: brings flipper length (mm) and body mass (g) near the other features.
# Every column name of the features in either schema: a request's cells in these must all be given.
FEATURE_COLUMNS = {column for schema in SCHEMAS.values() for name, column in schema.items() if name in FEATURES}
COURSE_SCALE = np.array([1.0, 1.0, 1.0, 10.0, 100.0], dtype=np.float32)
# What a penguin can measure, generously (the 344 Palmer penguins span 32-60, 13-21.5, 172-231 mm and 2700-6300 g;
# docs/tasks.md): a training value outside is a typo or another unit, and would widen the ranges predict accepts.
PLAUSIBLE = {
    "culmen_length": (20.0, 80.0),
    "culmen_depth": (8.0, 30.0),
    "flipper_length": (120.0, 260.0),
    "body_mass": (1500.0, 9000.0),
}
UNITS = {"culmen_length": "mm", "culmen_depth": "mm", "flipper_length": "mm", "body_mass": "g"}
# Cells read as missing (the row is dropped, as the course does); pandas' other defaults, "nan" and its kin, are
# values that are not numbers, and refused where they stand.
MISSING = ["", "NA", "N/A", "n/a", "#N/A", "#NA", "<NA>", "NULL", "null", "None"]


SCHEMA_COLUMNS = {column for schema in SCHEMAS.values() for column in schema.values()}  # every column a model reads
SAVE_AS = 'save it as a comma-separated CSV in UTF-8 (a spreadsheet\'s "CSV UTF-8 (Comma delimited)")'


def not_utf8(start: bytes) -> str | None:
    """What a CSV that is not UTF-8 is, by its first bytes, and the fix (None: no telling): a spreadsheet's "Unicode
    Text" (UTF-16) or its workbook itself (a zip). Predict's reader and the scoring script's say it alike; the
    decoder's own reason ('invalid start byte') tells neither what the file is nor what to give."""
    if start[:2] in (b"\xff\xfe", b"\xfe\xff"):  # UTF-16's byte order mark
        return f"UTF-16 text, not UTF-8; {SAVE_AS}"
    # Without a byte order mark, a header's letters in UTF-16 are each one byte beside a NUL: valid UTF-8 bytes, read
    # as a header of none of the columns ("missing columns") unless told by the NULs' places.
    if len(start) >= 4 and start[1::2] == b"\x00" * len(start[1::2]) and b"\x00" not in start[0::2]:
        return f"UTF-16LE text (without a byte order mark), not UTF-8; {SAVE_AS}"
    if len(start) >= 4 and start[0::2] == b"\x00" * len(start[0::2]) and b"\x00" not in start[1::2]:
        return f"UTF-16BE text (without a byte order mark), not UTF-8; {SAVE_AS}"
    if start[:4] == b"PK\x03\x04":  # a zip: an Excel workbook (.xlsx) itself, most likely
        return f"a zip archive (an Excel workbook?), not a CSV; {SAVE_AS}"
    return None


def check_csv_layout(reader, where: str) -> tuple[list[str], int, int]:
    """The header of a CSV (`reader`: a csv.reader of it), the line it is on (the first not blank; 0 for none) and
    how many rows follow it (blank ones not counted). Predict's reader (datamodules/penguins.py) and the scoring
    script's (scripts/score.py) both check a CSV's layout here, so that a file refused by one is refused alike by the
    other. Refuses, as DataError naming `where`:
    - a header of one column holding semicolons (a spreadsheet in a language whose decimal mark is a comma), tabs or
      '|': read as one column, it was refused as missing the columns it names;
    - a column the model reads named twice (two BodyMass columns): pandas renamed the second `BodyMass.1`, and the
      first was read without a word, whichever the user meant (other columns may repeat);
    - a row with more values than the header names (`5,000` for 5000, or a stray value): pandas would take the first
      field of every row as its index and shift the rest one column left. Empty fields past the header's are a
      spreadsheet's trailing commas, and fine; the header's own are dropped from it.
    Lines are the file's own (reader.line_num), blank lines counted."""
    header = next((record for record in reader if any(cell.strip() for cell in record)), [])  # not blank
    header_line = reader.line_num
    while header and not header[-1].strip():  # a trailing comma on the header too
        header = header[:-1]
    separator = next((s for s in ";\t|" if len(header) == 1 and s in header[0]), None)
    if separator is not None:  # a spreadsheet set to another language's list separator
        raise DataError(f"{where}: its columns are separated by {separator!r}, not commas; {SAVE_AS}")
    names = [name.lstrip("\ufeff").strip() for name in header]  # as penguin_table matches them
    if twice := next((name for name in names if name in SCHEMA_COLUMNS and names.count(name) > 1), None):
        where_named = " and ".join(str(i + 1) for i, name in enumerate(names) if name == twice)
        raise DataError(
            f"{where}: column {twice} is named {names.count(twice)} times (columns {where_named}); keep one, or "
            "rename the others"
        )
    rows = 0
    for record in reader:
        # The cells past the header's, looked at only in a row that has any: a batch file has many rows.
        extra = [cell for cell in record[len(header) :] if cell.strip()] if len(record) > len(header) else []
        if header and extra:
            listed = ", ".join(name.lstrip("\ufeff") for name in header)
            raise DataError(
                f"{where}: line {reader.line_num} has {len(header) + len(extra)} values, the header names "
                f"{len(header)} columns ({listed}); remove the extra values (a thousands separator: 5000, not 5,000) "
                "or name their columns"
            )
        rows += bool("".join(record).strip())  # not blank: some cell has more than spaces
    return header, header_line, rows


def drop_blank_rows(frame, header_line: int):
    """`frame` (a CSV read by pandas from its header's line, blank lines kept as rows) less its rows of nothing
    (blank, spaces, or commas only), indexed so that row i is line i + 2 of the file: pandas' own skipping of blank
    lines numbered the rows after one a line too early, and predict and the scoring script named the wrong line."""
    blank = np.ones(len(frame), dtype=bool)
    for _, column in frame.items():  # column by column, not a Python call per cell: a batch CSV has many
        values = column.to_numpy()
        if values.dtype == object:  # missing (NaN, not equal to itself) or text of spaces
            blank &= (values != values) | (column.astype(str).str.strip() == "").to_numpy()
        else:  # numbers: blank only where missing
            blank &= column.isna().to_numpy()
    return frame.set_axis(frame.index + header_line - 1)[~blank]


# The course's example penguin (a Gentoo), in palmerpenguins' schema: the registered model's input example.
EXAMPLE = {"island": ["Biscoe"], "bill_length_mm": [50.4], "bill_depth_mm": [15.3], "flipper_length_mm": [200.0],
           "body_mass_g": [5000.0]}  # fmt: skip


def penguin_table(
    frame,
    where: str,
    need_species: bool = True,
    row_name=lambda index: f"line {index + 2}",
    needs: str = "a penguin CSV needs",
):
    """`frame` (a pandas DataFrame in either schema) in our column names, complete rows only, island as an index;
    what `read_penguins` makes of a file and the scoring script (scripts/score.py) of a request's rows. `where` names
    the source in messages, `row_name(index)` a row of it (a CSV's line: +1 for the header, +1 for counting from 1),
    `needs` what the message says a row needs."""
    import pandas as pd

    # A header typed "Island, CulmenLength, ..." (a space after each comma) names the columns a penguin CSV needs:
    # read with its spaces, it was refused as lacking them. Kept as given where stripping would make two columns one.
    stripped = [column.strip() if isinstance(column, str) else column for column in frame.columns]
    if len(set(stripped)) == len(stripped):
        frame = frame.set_axis(stripped, axis=1)
    wanted = [name for name in SCHEMAS["course"] if need_species or name != "species"]
    schema = next((s for s in SCHEMAS.values() if all(s[name] in frame.columns for name in wanted)), None)
    if schema is None:
        options = " or ".join(", ".join(s[n] for n in wanted) for s in SCHEMAS.values())
        # The schema it comes closest to, and what it lacks of it: "no body_mass_g" tells what to add.
        closest = max(SCHEMAS.values(), key=lambda s: sum(s[name] in frame.columns for name in wanted))
        lacking = ", ".join(closest[name] for name in wanted if closest[name] not in frame.columns)
        raise DataError(f"{where}: missing columns; {needs} {options} (no {lacking})")
    table = frame[[schema[name] for name in wanted]].set_axis(wanted, axis=1)
    table.attrs["columns"] = schema  # the file's own column names, for messages

    for column in FEATURES[1:]:
        numbers = pd.to_numeric(table[column], errors="coerce")
        given = table[column].notna()
        # Only the cells given that are no number are read as text (not every cell of a batch file): "nan", "inf" and
        # their kin are numbers that are none, refused below; anything else ("12 mm", "3,750") is no number at all.
        unread = table[column][given & numbers.isna()]
        spelled = unread.astype(str).str.strip().str.lower().str.lstrip("+-")
        bad = unread.index[~spelled.isin(NOT_A_NUMBER)]
        if len(bad):
            raise DataError(
                f"{where}: column {schema[column]} has a non-numeric value "
                f"{table[column][bad[0]]!r} on {row_name(int(bad[0]))}; fix or remove that row"
            )
        infinite = given & (numbers.isna() | numbers.abs().eq(float("inf")))
        if infinite.any():
            row = infinite.idxmax()
            value = str(table[column][row]).strip()
            raise DataError(
                f"{where}: {row_name(int(row))}, column {schema[column]}: {value!r} is not a finite number; give the "
                "measurement, or leave the cell empty to drop the row"
            )
        table[column] = numbers
    gaps = table.isna()
    lacking = gaps.any(axis=1).to_numpy()
    # Each row dropped, with the columns it lacks: predict names them, rather than answering one row fewer. Put in
    # table.attrs last: pandas copies attrs, deeply, into every frame and column made from the table.
    incomplete = {
        int(row): [schema[name] for name, gap in zip(wanted, row_gaps) if gap]
        for row, row_gaps in zip(gaps.index[lacking], gaps.to_numpy()[lacking])
    }
    table = table.dropna()  # keeps the index: row i is line i + 2 of the file
    if table.empty:
        raise DataError(f"{where}: no row has all of {', '.join(schema[n] for n in wanted)}")

    table["island"] = table["island"].map(lambda island: island.strip() if isinstance(island, str) else island)
    unknown = ~table["island"].isin(ISLANDS)  # an exact match, as the species: "dream" is no island of the model's
    if unknown.any():
        row = unknown.idxmax()
        island = table["island"][row]
        island = island.item() if hasattr(island, "item") else island  # numpy's 1, not np.int64(1)
        raise DataError(
            f"{where}: unknown island {island!r} in column {schema['island']} on {row_name(int(row))}; "
            f"the model knows {', '.join(ISLANDS)}"
        )
    table["island"] = table["island"].map(ISLANDS.index)
    if need_species:
        table["species"] = table["species"].map(species_index)
        if (table["species"] < 0).any():
            row = int((table["species"] < 0).idxmax())
            value = frame[schema["species"]][row]
            raise DataError(
                f"{where}: line {row + 2}: {schema['species']} '{value}' is none of {', '.join(SPECIES)} or 0/1/2; "
                "fix or remove that row"
            )
    table.attrs["incomplete"] = incomplete
    return table


NOT_A_NUMBER = {"nan", "inf", "infinity", "1.#qnan", "1.#ind"}  # what pandas and Python read as a float that is none


def species_index(value) -> int:
    """0, 1 or 2 for a species named (palmerpenguins) or numbered (the course; pandas reads 1 as 1.0 in a column
    with an empty cell); -1 for anything else."""
    if isinstance(value, str):
        value = value.strip()
        return SPECIES.index(value) if value in SPECIES else int(value) if value in ("0", "1", "2") else -1
    try:
        return int(value) if float(value) in (0.0, 1.0, 2.0) else -1
    except (TypeError, ValueError):
        return -1


def scale_features(raw: np.ndarray, seen: dict[str, np.ndarray] | None, preprocessing: str) -> np.ndarray:
    """The model's inputs from raw measurements (FEATURES order, island as an index): the course's scaling, or
    standardised with the training split's statistics `seen` (what a checkpoint's datamodule state holds)."""
    if preprocessing == "course":
        return raw / COURSE_SCALE
    return (raw - seen["mean"]) / seen["std"]


def check_ranges(raw: np.ndarray, seen: dict[str, np.ndarray], where, row_names, columns: dict) -> None:
    """Refuses measurements far outside the training split's (most likely another unit, as the course's
    scaled example: flipper 20, mass 50): the model would answer with confidence, and wrongly. `row_names` name the
    rows of `raw` in the message, `columns` maps our names to the source's column names."""
    low, high = seen["low"], seen["high"]
    margin = (high - low) / 2
    outside = (raw < low - margin) | (raw > high + margin)
    outside[:, 0] = False  # the island index is checked by name when read
    if outside.any():
        row, column = (int(i) for i in np.argwhere(outside)[0])
        name = columns[FEATURES[column]]
        raise DataError(
            f"{where}: {row_names[row]}: {name} {float(raw[row, column]):g} is far "
            f"outside what the model was trained on ({float(low[column]):g} to {float(high[column]):g}); "
            "give millimetres and grams, as in the training data"
        )


def serving_batch(state: dict, inputs, names: list[str]) -> np.ndarray:
    """Rows (a pandas DataFrame in either CSV schema's columns; one name each, for messages) read, range-checked and
    scaled as predict reads a CSV, as the network's input batch (N, 5). A row with a value missing is refused rather
    than dropped (predict skips it), so that every answer has its row."""
    frame = inputs.reset_index(drop=True)
    known = [column for column in frame.columns if column in FEATURE_COLUMNS]
    # A list or a dict in a cell (JSON's wrong type) would otherwise fail deep in pandas; true/false, read as 1/0, was
    # refused as a measurement far outside the training data's (a column of them only is bool, not object).
    for column in [column for column in known if frame[column].dtype in (object, bool)]:
        odd = frame[column].map(lambda value: isinstance(value, bool) or not isinstance(value, str | int | float))
        odd &= frame[column].notna()
        if odd.any():
            row = int(odd.to_numpy().argmax())
            value = frame[column][row]
            raise DataError(
                f"request: {names[row]}, column {column}: a {type(value).__name__} ({str(value)[:40]}); give one "
                "string or number per cell (island: a name, the measurements: numbers)"
            )
    gaps = frame[known].isna()
    if gaps.to_numpy().any():
        row = int(gaps.any(axis=1).to_numpy().argmax())
        missing = ", ".join(column for column in known if gaps.loc[row, column])
        raise DataError(f"request: {names[row]} has no value for {missing}; give every column")
    table = penguin_table(
        frame,
        "request",
        need_species=False,
        row_name=lambda index: names[index],
        needs="each row (a JSON object's fields, or a CSV's columns) needs",
    )
    raw = table[list(FEATURES)].to_numpy(dtype="float32")
    seen = {key: np.asarray(value, dtype=np.float32) for key, value in state["seen"].items()}
    check_ranges(raw, seen, "request", names, table.attrs["columns"])
    return scale_features(raw, seen, state["preprocessing"])
