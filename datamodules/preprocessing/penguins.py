"""Penguin rows as the network sees them, with pandas and numpy only (the registered model ships this file): either
schema's columns read (`penguin_table`) and scaled, for datamodules/penguins.py and new_penguins.py.

    python -m scripts.train predict --config configs/penguins.yaml --ckpt_path CKPT --data.predict_path new.csv
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from datamodules.errors import DataError

SPECIES = ("Adelie", "Gentoo", "Chinstrap")  # the course's label order: Species 0, 1, 2
ISLANDS = ("Torgersen", "Biscoe", "Dream")  # order of first appearance in the data
FEATURES = ("island", "culmen_length", "culmen_depth", "flipper_length", "body_mass")
KINDS = {name: "categorical" if name == "island" else "numeric" for name in FEATURES}  # each feature's, as tables say
SCHEMAS = {  # each schema's column for each of our names; species is absent at predict time
    "palmerpenguins": {"island": "island", "culmen_length": "bill_length_mm", "culmen_depth": "bill_depth_mm",
                       "flipper_length": "flipper_length_mm", "body_mass": "body_mass_g", "species": "species"},
    "course": {"island": "Island", "culmen_length": "CulmenLength", "culmen_depth": "CulmenDepth",
               "flipper_length": "FlipperLength", "body_mass": "BodyMass", "species": "Species"},
}  # fmt: skip
SCHEMA_COLUMNS = {column for schema in SCHEMAS.values() for column in schema.values()}  # every column a model reads
COURSE_SCALE = np.array([1.0, 1.0, 1.0, 10.0, 100.0], dtype=np.float32)  # flipper and mass near the others
# What a penguin can measure, generously (the 344 Palmer penguins span 32-60, 13-21.5, 172-231 mm and 2700-6300 g;
# docs/tasks.md): a training value outside is a typo or another unit, and would widen the ranges predict accepts.
PLAUSIBLE = {"culmen_length": (20.0, 80.0), "culmen_depth": (8.0, 30.0), "flipper_length": (120.0, 260.0),
             "body_mass": (1500.0, 9000.0)}  # fmt: skip
UNITS = {"culmen_length": "mm", "culmen_depth": "mm", "flipper_length": "mm", "body_mass": "g"}
# Cells read as missing (the row is dropped, as the course does); pandas' other defaults ("nan"...) are refused.
MISSING = ["", "NA", "N/A", "n/a", "#N/A", "#NA", "<NA>", "NULL", "null", "None"]
NOT_A_NUMBER = {"nan", "inf", "infinity", "1.#qnan", "1.#ind"}  # what pandas and Python read as a float that is none


def read_penguins(path: str | Path | None, need_species: bool = True):
    """The table in our column names, complete rows only; `path=None` reads `palmerpenguins`."""
    if path is None:
        from palmerpenguins import load_penguins

        return penguin_table(load_penguins(), "palmerpenguins", need_species)
    if not Path(path).is_file():
        raise DataError(f"{path}: no such file; give an existing CSV")
    from datamodules.preprocessing.csv_files import read_csv

    return penguin_table(read_csv(path, MISSING, SCHEMA_COLUMNS), str(path), need_species)


def penguin_table(
    frame,
    where: str,
    need_species: bool = True,
    row_name=lambda index: f"line {index + 2}",
    needs: str = "a penguin CSV needs",
):
    """`frame` (a pandas DataFrame in either schema: a file's, or a request's rows) in our column names, complete rows
    only, island as an index. `where` names the source in messages, `row_name(index)` a row of it (a CSV's line: +1
    for the header, +1 for counting from 1), `needs` what the message says a row needs."""
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
        closest = max(SCHEMAS.values(), key=lambda s: sum(s[name] in frame.columns for name in wanted))
        lacking = ", ".join(closest[name] for name in wanted if closest[name] not in frame.columns)  # what to add
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


def species_index(value) -> int:
    """0, 1 or 2 for a species named or numbered (1.0 too: pandas' 1 in a column with an empty cell); else -1."""
    if isinstance(value, str):
        value = value.strip()
        return SPECIES.index(value) if value in SPECIES else int(value) if value in ("0", "1", "2") else -1
    try:
        return int(value) if float(value) in (0.0, 1.0, 2.0) else -1
    except (TypeError, ValueError):
        return -1


def scale_features(raw: np.ndarray, seen: dict[str, np.ndarray] | None, preprocessing: str) -> np.ndarray:
    """The model's inputs from raw measurements (FEATURES order), by the course or the training split's `seen`."""
    if preprocessing == "course":
        return raw / COURSE_SCALE
    return (raw - seen["mean"]) / seen["std"]
