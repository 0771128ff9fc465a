"""How `python -m scripts.spark fit` maps onto Spark and the Trainer: its own options (--num_processes, --master) out of
scripts.train's, the fit's config parsed as scripts.train parses it (nothing built), and N processes laid out as
Spark tasks x the GPUs of a task. Everything here runs on the driver, before or without a Spark session.

    python -m scripts.spark fit --config configs/penguins.yaml --num_processes 2
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

from scripts.spark.cluster import SparkFitError

if TYPE_CHECKING:
    from jsonargparse import Namespace

LAUNCH_OPTIONS = ("--trainer.devices", "--trainer.num_nodes")  # set here from --num_processes and the GPUs
# The master URLs Spark takes (SparkContext's own forms), checked before a JVM starts: Spark's answer to another is a
# 75-line Java and Python traceback after the JVM's start.
MASTER_URL = re.compile(
    r"local|local\[(\d+|\*)(,\s*\d+)?\]|local-cluster\[\d+,\s*\d+,\s*\d+\]|yarn"
    r"|(spark|k8s|mesos)://\S+|sc://\S+"
)


@dataclass
class Launch:
    """How N processes map onto Spark tasks and the Trainer: `devices` processes (GPUs) per task, `num_nodes` tasks."""

    num_processes: int
    use_gpu: bool
    devices: int
    num_nodes: int
    strategy: str | None  # set when the config leaves it to Lightning ("auto")

    def trainer_args(self) -> list[str]:
        args = ["--trainer.accelerator", "gpu" if self.use_gpu else "cpu"]
        args += ["--trainer.devices", str(self.devices), "--trainer.num_nodes", str(self.num_nodes)]
        return args + (["--trainer.strategy", self.strategy] if self.strategy else [])


def split_options(argv: list[str]) -> tuple[int, str | None, list[str]]:
    """--num_processes and --master out of the command line; the rest is scripts.train's `fit` and its options."""
    values: dict[str, str] = {}
    rest: list[str] = []
    args = iter(argv)
    for arg in args:
        name, equals, value = arg.partition("=")
        if name in ("--num_processes", "--master"):
            values[name] = value if equals else next(args, "")
        else:
            rest.append(arg)
    if not rest or rest[0] != "fit":
        given = rest[0] if rest else "nothing"
        raise SparkFitError(
            f"scripts.spark runs fit or score (given: {given}); validate, test and predict a checkpoint with "
            "scripts.train"
        )
    number = values.get("--num_processes", "")
    if not number.isdigit() or int(number) < 1:
        given = number or "(missing)"
        raise SparkFitError(f"--num_processes {given}: give the number of processes to train, 1 or more")
    for arg in rest:
        if arg.split("=")[0] in LAUNCH_OPTIONS:
            raise SparkFitError(
                f"{arg.split('=')[0]}: the Spark launcher sets devices x num_nodes from --num_processes and the GPUs "
                "of a task; leave it out"
            )
    master = values.get("--master") or None
    if master is not None and not MASTER_URL.fullmatch(master):
        raise SparkFitError(
            f"--master {master}: not a Spark master URL; give local[N], local-cluster[W,C,M] (W workers of C cores "
            "and M MB), spark://HOST:PORT, yarn or k8s://HOST:PORT"
        )
    return int(number), master, rest[1:]


def resolve_trainer(args: list[str]) -> Namespace:
    """The `fit` config as scripts.train parses it (a bad option is one line here, before Spark runs anything); nothing
    is built, no data read."""
    import logging
    import warnings

    from jsonargparse import ArgumentError

    from scripts.train import cli_main
    from scripts.training.cli import TemplateCLI
    from scripts.training.cli_errors import config_error_line, user_errors

    class Parsed(Exception):
        def __init__(self, config) -> None:
            self.config = config

    class ParseOnly(TemplateCLI):
        def before_instantiate_classes(self) -> None:
            raise Parsed(self.config[self.subcommand])

    warnings.filterwarnings("ignore", "LightningCLI's args parameter")  # sys.argv is scripts.spark's, args its part
    seed_log = logging.getLogger("lightning.fabric.utilities.seed")  # the tasks seed; here it would be noise
    level = seed_log.level
    seed_log.setLevel(logging.WARNING)
    try:
        cli_main(["fit", *args], cli_class=ParseOnly)
    except Parsed as parsed:
        return parsed.config
    except ArgumentError as error:
        raise SparkFitError(config_error_line(error, args)) from None
    except user_errors() as error:  # a --ckpt_path that is not a checkpoint, say
        raise SparkFitError(str(error).strip()) from None
    finally:
        seed_log.setLevel(level)
    raise SparkFitError("the config did not parse")  # --help and --print_config exit before this


def strategy_name(trainer) -> str:
    """The Trainer's strategy as given: a name ("auto", "ddp") or a class path."""
    return trainer.strategy if isinstance(trainer.strategy, str) else str((trainer.strategy or {}).get("class_path"))


def check_launcher(trainer) -> None:
    """Refuses what Spark's torch.distributed processes cannot run: Horovod, mpirun's environment, other devices."""
    if "horovod" in strategy_name(trainer).lower():
        raise SparkFitError(
            "configs/trainer/horovod.yaml: TorchDistributor starts torch.distributed processes; Horovod needs "
            "horovodrun or mpirun: leave the Horovod preset out (DDP trains the same weights)"
        )
    if "MPIEnvironment" in str(trainer.plugins):
        raise SparkFitError(
            "configs/trainer/ddp_mpi.yaml: Spark starts the processes with torch.distributed's variables, not mpirun; "
            "leave the preset out"
        )
    if str(trainer.accelerator) not in ("auto", "cpu", "gpu", "cuda"):
        raise SparkFitError(f"--trainer.accelerator {trainer.accelerator}: Spark tasks train on cpu or gpu")


def plan_launch(trainer, num_processes: int, task_gpus: int) -> Launch:
    """Devices x num_nodes, accelerator and strategy for N processes on tasks that Spark gives `task_gpus` GPUs each."""
    check_launcher(trainer)
    accelerator = str(trainer.accelerator)
    use_gpu = accelerator in ("gpu", "cuda") or (accelerator == "auto" and task_gpus >= 1)
    if use_gpu and task_gpus < 1:
        raise SparkFitError(
            f"--trainer.accelerator {accelerator}: this Spark cluster gives its tasks no GPU; set "
            "spark.task.resource.gpu.amount 1 in its Spark config (a GPU cluster), or give --trainer.accelerator cpu"
        )
    if use_gpu and num_processes % task_gpus:
        raise SparkFitError(
            f"--num_processes {num_processes}: each Spark task gets {task_gpus} GPUs (spark.task.resource.gpu.amount); "
            f"give a multiple of {task_gpus}"
        )
    per_task = task_gpus if use_gpu else 1
    strategy = "ddp" if strategy_name(trainer) == "auto" else None
    return Launch(num_processes, use_gpu, per_task, num_processes // per_task, strategy)


def task_gpus(spark) -> int:
    """GPUs Spark gives each task (spark.task.resource.gpu.amount); TorchDistributor reads it as a whole number."""
    amount = spark.conf.get("spark.task.resource.gpu.amount", "0") or "0"
    if not amount.isdigit():  # a fraction (several tasks per GPU) is TorchDistributor's ValueError
        raise SparkFitError(
            f"spark.task.resource.gpu.amount {amount}: TorchDistributor runs whole GPUs per task; set 1 (one process "
            "per GPU) in the Spark config of the cluster that trains"
        )
    return int(amount)
