"""The newest best checkpoint trained on the data a config and its options name: the path `make predict`, `evaluate`,
`export` and `serve` use when CKPT is not given.

    python -m scripts.checkpoint_of --config configs/birds.yaml --data.init_args.data_dir photos/

A run's data is what its config.yaml (beside its checkpoints: OUTPUTS/<experiment>/<run>/config.yaml) recorded: the
datamodule's class and its data options (those named `*_dir`, `*_path` or `*_file` but predict_path, `label`, and the
split's, `seed`, `val_fraction`, `test_fraction`, `val_size`, `id_column`: a run split otherwise would be tested on rows
it trained on; relative paths read from the current folder, as make runs). Options other than `--config` and `--data.*`
are passed over (make hands every verb's ARGS here: `--port 5002`, `--output model.onnx`), but
`--trainer.default_root_dir`, which says where the runs are. Prints the checkpoint's path; one line on stderr names it.
No run of that data is an error listing the runs there are to choose from (CKPT=...). YAML and the standard library
only: the defaults of options neither the config nor ARGS give are read from the datamodule's source, and its module is
imported only where one of them is not a literal.
"""

from __future__ import annotations

import importlib
import inspect
import os
import sys
from pathlib import Path

OUTPUTS = "outputs"  # scripts.train's default --trainer.default_root_dir


SPLIT_OPTIONS = (
    "seed",
    "val_fraction",
    "test_fraction",
    "val_size",
    "id_column",
    "test_path",
)  # another split: others' test rows


def is_data_option(name: str) -> bool:
    return name in ("label", *SPLIT_OPTIONS) or (name.endswith(("_dir", "_path", "_file")) and name != "predict_path")


def read_yaml(path: str | Path) -> dict:
    import yaml

    try:
        loaded = yaml.safe_load(Path(path).read_text())
    except (OSError, yaml.YAMLError) as error:
        raise SystemExit(f"error: {path}: not a readable YAML config ({error}); give --config a task's YAML") from None
    return loaded if isinstance(loaded, dict) else {}


def parse_value(text: str):
    import yaml

    try:
        return yaml.safe_load(text)
    except yaml.YAMLError:
        return text


def given(args: list[str]) -> tuple[str | None, dict, str]:
    """(datamodule class, data options, runs folder) of `--config FILE ...` and the options after, in order: a later
    config or option overrides an earlier one, as in scripts.train."""
    class_path, options, root = None, {}, OUTPUTS
    pairs, i = [], 0
    while i < len(args):
        arg = args[i]
        if arg.startswith("--") and "=" in arg:
            pairs.append(tuple(arg[2:].split("=", 1)))
        elif arg.startswith("--") and i + 1 < len(args) and not args[i + 1].startswith("--"):
            pairs.append((arg[2:], args[i + 1]))
            i += 1
        i += 1
    for key, value in pairs:
        if key == "config":
            config = read_yaml(value)
            data = config.get("data") or {}
            if isinstance(data, dict):
                class_path = data.get("class_path", class_path)
                options.update(data.get("init_args") or {})
            root = (config.get("trainer") or {}).get("default_root_dir") or root
        elif key in ("data.class_path", "data"):
            class_path = value
        elif key.startswith(("data.init_args.", "data.")):
            options[key.rsplit(".", 1)[1]] = parse_value(value)
        elif key == "trainer.default_root_dir":
            root = value
    return class_path, options, root


def defaults(class_path: str) -> dict:
    """The datamodule's own defaults of its data options, read from its signature: in its source where they are
    literals (importing a datamodule imports torch and Lightning, seconds of every `make predict`'s start), else from
    the imported class."""
    module, _, name = class_path.rpartition(".")
    found = literal_defaults(module, name)
    if found is not None:
        return found
    try:
        cls = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as error:
        raise SystemExit(f"error: data.class_path {class_path}: does not import ({error})") from None
    return {
        key: parameter.default
        for key, parameter in inspect.signature(cls.__init__).parameters.items()
        if is_data_option(key) and parameter.default is not inspect.Parameter.empty
    }


def literal_defaults(module: str, name: str) -> dict | None:
    """The defaults of the data options of class `name`'s own __init__ in `module`'s source, or None where that source,
    that __init__ or one of those defaults is not there as a literal."""
    import ast
    import importlib.util

    try:
        spec = importlib.util.find_spec(module)
        tree = ast.parse(Path(spec.origin).read_text())
    except (ImportError, ValueError, AttributeError, TypeError, OSError, SyntaxError):
        return None
    classes = [node for node in tree.body if isinstance(node, ast.ClassDef) and node.name == name]
    body = classes[-1].body if classes else []
    inits = [node for node in body if isinstance(node, ast.FunctionDef) and node.name == "__init__"]
    if not inits:
        return None
    arguments = inits[-1].args
    positional = arguments.posonlyargs + arguments.args
    pairs = [*zip(positional[len(positional) - len(arguments.defaults) :], arguments.defaults),
             *zip(arguments.kwonlyargs, arguments.kw_defaults)]  # fmt: skip
    found = {}
    for argument, default in pairs:
        if default is None or not is_data_option(argument.arg):
            continue
        try:
            found[argument.arg] = ast.literal_eval(default)
        except (ValueError, TypeError, SyntaxError):
            return None
    return found


def same_path(value):
    """A local path as an absolute one, so `data/birds` and `./data/birds/` are one; URLs and assets as given."""
    if isinstance(value, str) and "://" not in value and not value.startswith("azureml:"):
        return os.path.abspath(value)
    return value


def identity(class_path: str | None, options: dict, fallback: dict) -> tuple:
    data = {key: options.get(key, fallback.get(key)) for key in set(options) | set(fallback)}
    data = {key: same_path(value) if key.endswith(("_dir", "_path", "_file")) else value for key, value in data.items()}
    return class_path, tuple(sorted((key, value) for key, value in data.items() if is_data_option(key)))


def describe(ident: tuple, wanted: tuple | None = None) -> str:
    """The run's data options, its split's only where they differ from `wanted`'s (or are not the defaults)."""
    class_path, options = ident
    split = dict(wanted[1]) if wanted else {}
    shown = [(key, value) for key, value in options if key not in SPLIT_OPTIONS or (wanted and split.get(key) != value)]
    return f"{class_path.rpartition('.')[2] if class_path else '?'} on " + (
        ", ".join(f"{key}={value}" for key, value in shown) or "its default data"
    )


def same_data(wanted: tuple, recorded: tuple) -> bool:
    """Whether a run's recorded data is the wanted: every wanted option the same, a split option where it has one."""
    options = dict(recorded[1])
    return recorded[0] == wanted[0] and all(
        options.get(key, value) == value if key in SPLIT_OPTIONS else key in options and options[key] == value
        for key, value in wanted[1]
    )


def runs(root: Path) -> list[tuple[Path, tuple]]:
    """(best checkpoint, data identity) of every run under `root` with one, newest first."""
    found = []
    for config in root.glob("*/*/config.yaml"):
        best = config.parent / "checkpoints" / "best.ckpt"
        if not best.is_file():
            continue
        data = read_yaml(config).get("data") or {}
        found.append((best, identity(data.get("class_path"), data.get("init_args") or {}, {})))
    return sorted(found, key=lambda run: run[0].stat().st_mtime, reverse=True)


def checkpoint_of(args: list[str]) -> Path:
    class_path, options, root = given(args)
    if class_path is None:
        raise SystemExit("error: the config names no data.class_path; give --config a task's YAML")
    wanted = identity(class_path, options, defaults(class_path))
    recorded = runs(Path(root))
    # A run's recorded options are all of its datamodule's; those the wanted identity lacks were not data options.
    matching = [best for best, data in recorded if same_data(wanted, data)]
    if matching:
        return matching[0]
    if not recorded:
        raise SystemExit(
            f"error: no checkpoint under {root}/; train on this data first (make train TASK=... ARGS=...), or give "
            "CKPT=path/to/best.ckpt"
        )
    listed = "; ".join(f"{best} ({describe(data, wanted)})" for best, data in recorded[:10])
    more = f" and {len(recorded) - 10} more" if len(recorded) > 10 else ""
    keys = sorted(key for key, _ in wanted[1] if key not in SPLIT_OPTIONS)  # a table's config names no data at all
    options = ", ".join(f"--data.init_args.{key}" for key in keys)
    raise SystemExit(
        f"error: no run under {root}/ trained {describe(wanted)}; give the fit's {options} in ARGS (FIT_ARGS for "
        f"export and serve), or CKPT= one of: {listed}{more}, or train on this data first"
    )


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    if not args or args[0] in ("-h", "--help"):
        print(f"usage: python -m scripts.checkpoint_of --config CONFIG [--data.init_args.NAME VALUE ...] "
              f"[--trainer.default_root_dir RUNS]\n\n{__doc__}")  # fmt: skip
        return
    if "--config" not in args and not any(arg.startswith("--config=") for arg in args):
        raise SystemExit("error: give --config configs/<task>.yaml (and the --data.* options of the fit)")
    best = checkpoint_of(args)
    print(f"checkpoint: {best}", file=sys.stderr)
    print(best)


if __name__ == "__main__":
    main()
