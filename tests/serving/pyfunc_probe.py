"""Loads a registered model with mlflow.pyfunc.load_model and predicts each case of a JSON file, writing the answers
(or each error's type and message) as JSON. tests/serving/test_pyfunc.py runs it in the serving environment, outside the
repository, so that only the model's own code and .venv-serve's packages (no torch) can answer:

    cd /tmp && /path/to/.venv-serve/bin/python /path/to/tests/serving/pyfunc_probe.py MODEL_DIR cases.json answers.json

A case is a DataFrame in pandas' split orientation ({"columns": [...], "data": [[...], ...]}); with "bytes": true its
`image` column holds base64 text to give the model as bytes.
"""

from __future__ import annotations

import base64
import importlib.util
import json
import sys


def main() -> None:
    import mlflow.pyfunc
    import pandas as pd

    model_dir, cases, target = sys.argv[1:]
    model = mlflow.pyfunc.load_model(model_dir)
    results = []
    with open(cases) as file:
        for case in json.load(file):
            frame = pd.DataFrame(case["data"], columns=case["columns"])
            if case.get("bytes"):
                frame["image"] = [base64.b64decode(text) for text in frame["image"]]
            try:
                answers = model.predict(frame)
                results.append({"columns": list(answers.columns), "data": answers.to_numpy().tolist()})
            except Exception as error:  # what a user of the model would catch: its type and message are the check
                results.append({"error": [kind.__name__ for kind in type(error).__mro__], "message": str(error)})
    loaded = sorted(name for name in ("torch", "torchvision", "lightning") if name in sys.modules)
    installed = sorted(name for name in ("torch", "lightning") if importlib.util.find_spec(name) is not None)
    with open(target, "w") as file:
        json.dump({"results": results, "loaded": loaded, "installed": installed}, file)


if __name__ == "__main__":
    main()
