"""Horovod for Lightning 2.x (Lightning 2.0 removed its own; PyPI's lightning-horovod does not run on 2.6).

horovodrun (or mpirun, or Azure ML's `mpi` distribution) starts one process per device; this strategy joins
them: gradients are averaged by Horovod's DistributedOptimizer (allreduce during backward, synchronized
before each step), the initial weights are rank 0's, and Lightning's collectives
(metric sync, early-stopping and checkpoint decisions) run as Horovod allreduce / allgather / broadcast.
The learning rate is left as configured: `--model.scale_lr_by_world_size true` scales it, as with DDP.

    horovodrun -np 2 python -m scripts.train fit --config configs/penguins.yaml --config configs/trainer/horovod.yaml \\
        --trainer.devices 2
"""

from __future__ import annotations

import os
from contextlib import ExitStack
from typing import Any

import lightning as L
import torch
from lightning.pytorch.core.optimizer import LightningOptimizer
from lightning.pytorch.strategies import ParallelStrategy
from lightning.pytorch.utilities.rank_zero import rank_zero_only

from strategies.launch_check import launched_processes
from strategies.mpi_environment import LaunchError


def horovod():
    """horovod.torch, imported only when the strategy is used (it loads MPI and Gloo)."""
    try:
        import horovod.torch as hvd
    except ImportError as error:
        raise LaunchError(f"Horovod is not installed ({error}); build it with `make horovod`") from None
    return hvd


class ContiguousGradients:
    """Horovod's Compressor interface (its DistributedOptimizer's `compression`): a gradient is averaged as a
    contiguous tensor, which Horovod's collectives require, and becomes the parameter's gradient. A channels-last
    weight's gradient is so a contiguous copy; the optimizer's arithmetic takes the two layouts together."""

    @staticmethod
    def compress(tensor: torch.Tensor) -> tuple[torch.Tensor, None]:
        return tensor.contiguous(), None

    @staticmethod
    def decompress(tensor: torch.Tensor, context: None) -> torch.Tensor:
        return tensor


class HorovodStrategy(ParallelStrategy):
    strategy_name = "horovod"

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.hvd = horovod()
        self.hvd.init()
        # Lightning's rank-zero-only printing and logging read this before fit sets it.
        rank_zero_only.rank = self.hvd.rank()
        self._synchronize_skipped: ExitStack | None = None

    @property
    def global_rank(self) -> int:
        return self.hvd.rank()

    @property
    def local_rank(self) -> int:
        return self.hvd.local_rank()

    @property
    def node_rank(self) -> int:
        return self.hvd.cross_rank()

    @property
    def world_size(self) -> int:
        return self.hvd.size()

    @property
    def root_device(self) -> torch.device:
        return self.parallel_devices[self.local_rank]

    @property
    def is_distributed(self) -> bool:
        # What Lightning asks a strategy it does not know before it gives DataLoaders a DistributedSampler and
        # before `self.log(..., sync_dist=True)` reduces; without it every process read every sample.
        return True

    @property
    def distributed_sampler_kwargs(self) -> dict[str, Any]:
        return {"num_replicas": self.world_size, "rank": self.global_rank}

    def setup_environment(self) -> None:
        started = launched_processes()
        if started != self.world_size:  # each process a world of its own would train alone, into the same outputs
            why = (
                "HOROVOD_CONTROLLER=gloo joins processes only under `horovodrun --gloo`, which starts gloo's "
                "rendezvous; unset it (and HOROVOD_CPU_OPERATIONS) under mpirun"
                if os.environ.get("HOROVOD_CONTROLLER", "").lower() == "gloo"
                else "start them all with one launcher (horovodrun or mpirun) and one Horovod"
            )
            raise LaunchError(f"the launcher started {started} processes but Horovod joined {self.world_size}: {why}")
        devices = len(self.parallel_devices)
        if devices != self.hvd.local_size():
            raise LaunchError(
                f"horovod started {self.world_size} processes, {self.hvd.local_size()} on this node, but the "
                f"Trainer has devices {devices}: give --trainer.devices {self.hvd.local_size()}"
            )
        if self.root_device.type == "cuda":
            if not self.hvd.cuda_built():
                raise LaunchError(
                    "this Horovod is built for CPUs (no CUDA, no NCCL) but the Trainer runs on GPUs: "
                    "give --trainer.accelerator cpu, or use DDP (configs/trainer/ddp.yaml) on GPUs"
                )
            torch.cuda.set_device(self.root_device)
        super().setup_environment()

    def model_to_device(self) -> None:
        self.model.to(self.root_device)

    def setup(self, trainer: L.Trainer) -> None:
        super().setup(trainer)  # model to its device, optimizers built
        if not trainer.training:
            return
        optimizers = [o.optimizer if isinstance(o, LightningOptimizer) else o for o in self.optimizers]
        self._broadcast_weights()
        # No hvd.broadcast_optimizer_state: Lightning restores a resumed run's optimizer state after this hook, the
        # same file on every process, and an optimizer not stepped yet has no state to send (Horovod's helper would
        # make some with a step of zero gradients: Adam would count a step, weight decay shrink the weights once).
        self.optimizers = [
            self.hvd.DistributedOptimizer(
                optimizer, named_parameters=self._named_parameters_of(optimizer), compression=ContiguousGradients
            )
            for optimizer in optimizers
        ]
        # Gradients are averaged right after each backward (post_backward), so that gradient clipping sees them
        # averaged and the step must not average again. Lightning accumulates: averaging is linear, so averaging
        # after every accumulated backward gives the average of the sum.
        self._synchronize_skipped = ExitStack()
        for optimizer in self.optimizers:
            self._synchronize_skipped.enter_context(optimizer.skip_synchronize())

    def _broadcast_weights(self) -> None:
        """Every process starts from rank 0's weights (and buffers). Horovod broadcasts contiguous tensors only: a
        channels-last weight (configs/mnist.yaml) travels as a contiguous copy and keeps its layout."""
        tensors = self.lightning_module.state_dict()
        sent = {name: tensor.contiguous() for name, tensor in tensors.items()}
        self.hvd.broadcast_parameters(sent, root_rank=0)
        for name, tensor in tensors.items():
            if sent[name] is not tensor:
                tensor.copy_(sent[name])

    def _named_parameters_of(self, optimizer: torch.optim.Optimizer) -> list[tuple[str, torch.nn.Parameter]]:
        """Horovod names each allreduce; a frozen backbone's parameters are in no optimizer and stay out."""
        optimized = {id(p) for group in optimizer.param_groups for p in group["params"]}
        return [(name, p) for name, p in self.lightning_module.named_parameters() if id(p) in optimized]

    def post_backward(self, closure_loss: torch.Tensor) -> None:
        for optimizer in self.optimizers:
            optimizer.synchronize()

    def reduce(self, tensor: Any, group: Any = None, reduce_op: Any = "mean") -> Any:
        if not isinstance(tensor, torch.Tensor):
            return tensor
        # Lightning passes "mean", "sum", "max" or "min" (self.log's reduce_fx), or a torch ReduceOp ("RedOpType.SUM").
        name = str(reduce_op or "mean").rsplit(".", 1)[-1].lower()
        hvd = self.hvd
        ops = {"mean": hvd.Average, "avg": hvd.Average, "sum": hvd.Sum, "max": hvd.Max, "min": hvd.Min}
        if name not in ops:
            raise ValueError(f"HorovodStrategy.reduce: reduce_op {reduce_op!r} is none of mean, sum, max, min")
        # Horovod fills its output in a background thread, outside the inference mode Lightning validates in,
        # which may not write to tensors made inside it: inputs and outputs are made outside it.
        with torch.inference_mode(False):
            return hvd.allreduce(tensor.clone(), op=ops[name])

    def all_gather(self, tensor: torch.Tensor, group: Any = None, sync_grads: bool = False) -> torch.Tensor:
        with torch.inference_mode(False):
            return self.hvd.allgather(tensor.clone().unsqueeze(0))  # (world size, *shape), as DDP's

    def broadcast(self, obj: Any, src: int = 0) -> Any:
        with torch.inference_mode(False):
            # Named: Horovod matches a collective by name, and its default is the object's type, which differs where
            # only the source has the object (`x if trainer.is_global_zero else None`): the ranks would wait forever.
            return self.hvd.broadcast_object(obj, root_rank=src, name="strategy.broadcast")

    def barrier(self, name: str | None = None) -> None:
        self.hvd.barrier()

    def teardown(self) -> None:
        if self._synchronize_skipped is not None:
            self._synchronize_skipped.close()
            self._synchronize_skipped = None
        super().teardown()
