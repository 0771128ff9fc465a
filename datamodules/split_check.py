"""The data a command is given, compared with the data its checkpoint saw (the identity datamodules/base.py keeps
in it): test, validate and predict split by the checkpoint's rule, so that the rows it tested are the rows tested,
never rows it trained on; a resumed fit goes on where the rows changed (each keeps its split) and stops where the
columns did. One line on stderr says what differs. Loaded only where a checkpoint's datamodule state is loaded.

    python -m scripts.train test --config configs/table.yaml --ckpt_path CKPT --data.init_args.csv_path FILE \\
        --data.init_args.label COLUMN
"""

from __future__ import annotations

import sys

import numpy as np

from datamodules.errors import DataError

OPTIONS = ("seed", "val_fraction", "test_fraction", "id_column")  # the rule's parts a config gives


def check_trained(datamodule, trained: dict | None) -> None:
    """Splits `datamodule` (split by its config's rule, its `identity` set) by the rule of the checkpoint whose
    datamodule state held `trained` (None: a checkpoint older than the rule, split by a seeded permutation), and says
    what differs, once; a resumed fit on other columns is a DataError."""
    given, said = datamodule.identity, datamodule.__dict__.setdefault("said", set())
    first = datamodule.trainer is None or datamodule.trainer.is_global_zero

    def say(line: str) -> None:  # once: a resumed fit compares before its weights load and again at its datamodule's
        if first and line not in said:
            said.add(line)
            print(line, file=sys.stderr)

    where = given["source"]
    rule = trained["split"] if trained else {**given["split"], "method": "seeded permutation"}
    differ = [f"data.init_args.{option} {rule.get(option)}, not {given['split'].get(option)}" for option in OPTIONS
              if rule.get(option) != given["split"].get(option)]  # fmt: skip
    if rule["method"] != given["split"]["method"]:
        say(f"{where}: the checkpoint predates kept split rules: split as its fit split then (a seeded permutation of "
            f"each class's rows, seed {rule['seed']})")  # fmt: skip
    elif differ:
        say(f"{where}: split as the checkpoint's fit split it ({', '.join(differ)}): its test rows are tested, none it "
            "trained on")  # fmt: skip
    if rule != given["split"]:
        datamodule.resplit(rule)
        given = datamodule.identity
    if not trained or trained["digest"] == given["digest"]:
        return
    fitting = datamodule.trainer is not None and datamodule.trainer.state.fn == "fit"
    schema, then = given["schema"], trained["schema"]
    if fitting and schema != then:
        removed = ", ".join(column for column in then if column not in schema) or "none"
        added = ", ".join(column for column in schema if column not in then) or "none"
        kinds = [
            f"{column} {kind} -> {schema[column]}" for column, kind in then.items() if schema.get(column, kind) != kind
        ]
        raise DataError(
            f"{where}: not the columns the checkpoint was trained on (removed: {removed}; added: {added}"
            + (f"; of another kind: {', '.join(kinds)}" if kinds else "")
            + "); a resumed fit goes on with its columns: give the table it was trained on, or a new --checkpoint_dir "
            "to train anew"
        )
    goes_on = "the fit goes on" if fitting else "its test split is this table's by the checkpoint's rule"
    if "row_hashes" in given and "row_hashes" in trained:
        now, before = given["row_hashes"].numpy(), trained["row_hashes"].numpy()
        added, removed = len(np.setdiff1d(now, before)), len(np.setdiff1d(before, now))
        counted = f"{added} row{'s' * (added != 1)} added, {removed} removed; "
    else:  # a streamed table keeps no row's hash (datamodules/table_stream.py), nor digests as one read whole does
        counted = (
            f"{trained.get('rows', '?')} rows then, {given['rows']} now; a streamed table's digest is of its "
            "own kind and counts no rows added or removed; "
        )
    say(f"{where}: not the table the checkpoint saw ({counted}digest {trained['digest']}, now {given['digest']}): each "
        f"row keeps its split by its own hash, so {goes_on}, and no row it trained on is tested")  # fmt: skip
