"""The registered table model's schema, enforced on every batch of rows it is given (by predict, the scoring script,
`mlflow models serve`, pyfunc, batch scoring and Spark alike: datamodules/preprocessing/table.py's serving_batch calls
it, and the model is saved without MLflow's input schema, which dropped the columns it did not name before the model
saw them). Torch-free: the registered model ships it.

    python -m scripts.train predict --config configs/table.yaml --ckpt_path CKPT --data.init_args.predict_path new.csv

Refused, naming the column: a column the model reads named twice (pandas reads a CSV's second `age` as `age.1`), a
column it reads absent, and a row whose cell of a column it reads is empty while it has a value in a column the model
does not know (neither read, left out at the fit, nor the label) that has no value in any row where the read one has
one: a JSON row with a misspelt key (`"Temp C"` for `"Temp °C"`), which pandas makes an empty cell of the right
column beside a column of the wrong name. A column the model does not know is otherwise ignored, as before.
"""

from __future__ import annotations

import re

import pandas as pd

from datamodules.errors import DataError


def check_columns(state: dict, frame: pd.DataFrame, names: list[str], where: str) -> None:
    """Refuses `frame` (rows named by `names`) as the module docstring says, in one line naming the column."""
    read = [column["name"] for column in state["columns"]]
    listed = ", ".join(repr(name) for name in read)
    send = f"send every column the model was trained on ({listed}), each once, a missing value as an empty cell"
    known = set(read) | set(state["left_out"]) | {state["label"]}
    unknown = [name for name in dict.fromkeys(frame.columns) if name not in known]
    given = list(frame.columns)
    for name in read:
        copies = [other for other in unknown if re.fullmatch(re.escape(str(name)) + r"\.\d+", str(other))]
        if given.count(name) > 1 or (name in given and copies):
            second = f" (the second read as {copies[0]!r})" if copies else ""
            raise DataError(f"{where}: column {name!r} is named {max(given.count(name), 2)} times{second}; {send}")
    absent = [name for name in read if name not in given]
    if absent:
        unread = [repr(name) for name in unknown][:5]
        raise DataError(
            f"{where}: no column {', '.join(repr(name) for name in absent)}; {send}"
            + (f" (it has {', '.join(unread)}, which the model does not read)" if unread else "")
        )
    if not unknown:
        return
    empty = {name: frame[name].isna().to_numpy() for name in [*read, *unknown]}
    for name in read:
        for other in unknown:
            instead = empty[name] & ~empty[other]
            if instead.any() and not (~empty[name] & ~empty[other]).any() and not empty[name].all():
                row = int(instead.argmax())
                raise DataError(
                    f"{where}: {names[row]}: no value for column {name!r} but one for {other!r}, which the model does "
                    f"not read (a misspelt name?); {send}"
                )
