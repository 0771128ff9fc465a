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
    what differs, once; a resumed fit on other columns is a DataError. A resumed fit compares twice (before its
    weights load, and as its datamodule's state loads): the second time, on the data the first left, does nothing."""
    compared = datamodule.__dict__.setdefault("compared", set())
    if trained and (trained["digest"], datamodule.identity["digest"]) in compared:
        return
    compare(datamodule, trained)
    if trained:
        compared.add((trained["digest"], datamodule.identity["digest"]))


def compare(datamodule, trained: dict | None) -> None:
    given, said = datamodule.identity, datamodule.__dict__.setdefault("said", set())
    first = datamodule.trainer is None or datamodule.trainer.is_global_zero

    def say(line: str) -> None:  # once: a resumed fit compares before its weights load and again at its datamodule's
        if first and line not in said:
            said.add(line)
            print(line, file=sys.stderr)

    where = given["source"]
    if not trained and given["split"]["method"] == "split folders":  # folder_split.FOLDERS: val/ is the split
        return
    rule = trained["split"] if trained else {**given["split"], "method": "seeded permutation"}
    differ = [f"data.init_args.{option} {rule.get(option)}, not {given['split'].get(option)}"
              for option in getattr(datamodule, "split_options", OPTIONS)
              if rule.get(option) != given["split"].get(option)]  # fmt: skip
    permuted, held_out = (getattr(datamodule, name, default) for name, default in
                          (("permuted", "each class's rows"), ("held_out", "its test rows are tested")))  # fmt: skip
    if not trained:
        say(f"{where}: the checkpoint predates kept split rules: split as its fit split then (a seeded permutation of "
            f"{permuted}, seed {rule['seed']})")  # fmt: skip
    elif rule["method"] != given["split"]["method"]:  # an image folder with val/ then, without it now, or the reverse
        say(f"{where}: the checkpoint was split by {rule['method']}, this data by {given['split']['method']}: what it "
            "trained on is left out of what is scored")  # fmt: skip
    elif differ:
        say(f"{where}: split as the checkpoint's fit split it ({', '.join(differ)}): {held_out}, none it trained on")
    if rule != given["split"]:
        datamodule.resplit(rule)
        given = datamodule.identity
    if not trained or (trained["digest"] == given["digest"] and rule == given["split"]):
        return
    fitting = datamodule.trainer is not None and datamodule.trainer.state.fn == "fit"
    if str(given["schema"].get("image", "")).startswith("image "):  # images (base.image_schema): files or digests
        return say(image_changes(datamodule, trained, fitting))
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


SPLIT_NAMES = {"train": "training", "val": "validation", "test": "test"}


def image_changes(datamodule, trained: dict, fitting: bool) -> str:
    """The line for images other than the checkpoint's: per split, the files added, removed, edited (a folder's, by
    path) or the images' count (MNIST's), and those a folder's held-out splits leave out as the checkpoint trained on
    them; a resumed fit on other classes is a DataError."""
    given, where = datamodule.identity, datamodule.identity["source"]
    then, now = trained["schema"]["label"], given["schema"]["label"]
    if fitting and then != now:
        raise DataError(
            f"{where}: not the classes the checkpoint was trained on ({then.removeprefix('label: ')}; now "
            f"{now.removeprefix('label: ')}); a resumed fit goes on with its classes: give the images it was trained "
            "on, or a new --checkpoint_dir to train anew"
        )
    if "files" not in given or "files" not in trained:  # MNIST's: each split's count where its digest differs
        splits, before = given["splits"], trained["splits"]
        changes = [f"{SPLIT_NAMES[name]} {before[name]['rows']} images, now {splits[name]['rows']}" for name in splits
                   if splits[name]["digest"] != before[name]["digest"]]  # fmt: skip
        left = {}
    else:
        changes, left = file_changes(datamodule, trained["files"].numpy())
    goes_on = "the fit goes on" if fitting else "none it trained on is tested"
    line = (f"{where}: not the images the checkpoint saw ({'; '.join(changes) or 'the same files'}; digest "
            f"{trained['digest']}, now {datamodule.identity['digest']}): each image keeps its split by its own bytes, "
            f"so {goes_on}")  # fmt: skip
    for split, files in left.items():
        more = f" and {len(files) - 1} more" if len(files) > 1 else ""
        line += f"; left out of {SPLIT_NAMES[split]}, as the checkpoint trained on them: {files[0]}{more}"
    return line


def file_changes(datamodule, then: np.ndarray) -> tuple[list[str], dict]:
    """(per split: files added, removed, edited; the files left out of val and test as the checkpoint trained on their
    bytes or their path) of an image folder, `then` the checkpoint's (content hash, path hash, split) rows."""
    now = datamodule.identity["files"].numpy()
    before, after = ({int(path): (int(content), int(split)) for content, path, split in rows} for rows in (then, now))
    edited = {path for path in before.keys() & after.keys() if before[path][0] != after[path][0]}
    changes = []
    for index, name in enumerate(("train", "val", "test")):
        added = sum(after[p][1] == index for p in after.keys() - before.keys())
        removed = sum(before[p][1] == index for p in before.keys() - after.keys())
        changed = sum(after[p][1] == index for p in edited)
        if added or removed or changed:
            changes.append(f"{SPLIT_NAMES[name]}: {added} added, {removed} removed, {changed} edited")
    trained = then[then[:, 2] == 0].astype(np.uint64)
    left = datamodule.leave_out(set(trained[:, 0].tolist()), set(trained[:, 1].tolist()))
    if empty := [name for name in ("val", "test") if name in datamodule.splits and not datamodule.splits[name][0]]:
        raise DataError(
            f"{datamodule.identity['source']}: every {SPLIT_NAMES[empty[0]]} image is one the checkpoint trained on "
            "(by its bytes or its path); give the images it was held out on, or a --ckpt_path trained on others"
        )
    return changes, left
