"""Data-parallel training across processes, on accelerate's process group (gloo on CPU, NCCL on
GPU). Start it with ``semrl train --num-processes N`` or ``accelerate launch -m semrl train``.

The split (docs/scale.md): every process draws the same global batch of
``prompts_per_step`` prompts and takes a contiguous share of whole prompts, so a group's chains
are always on one process and group statistics (advantages, dynamic sampling) are exact. Each
process computes the loss of its share with the *global* denominators and the gradients are
summed, so an update equals the single-process update on the global batch. With
``trainer.fsdp`` the model is sharded instead (``shard_model``) and samples from a full copy.
"""

from __future__ import annotations

import atexit
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any, cast

import torch
import torch.distributed as dist
from accelerate import PartialState

if TYPE_CHECKING:
    from torch.distributed.fsdp import MixedPrecisionPolicy

_CLOSE_HOOKS: list[Callable[[], None]] = []


def on_close(hook: Callable[[], None]) -> None:
    """Run ``hook`` when the process group closes, before it is destroyed (once per hook)."""
    if hook not in _CLOSE_HOOKS:
        _CLOSE_HOOKS.append(hook)


class ProcessGroup:
    """This process's place in the run; every collective is a no-op in a single process."""

    def __init__(self, cpu: bool | None = None) -> None:
        # without cpu=True, accelerate ignores a multi-process launch on a machine without GPUs
        self.state = PartialState(cpu=not torch.cuda.is_available() if cpu is None else cpu)
        self.rank = self.state.process_index
        self.world = self.state.num_processes
        self.device = self.state.device
        self.is_main = self.state.is_main_process
        if self.distributed and dist.is_initialized():
            # A process that exits with a gloo group alive can abort in C++ ("terminate called without
            # an active exception"): the group's threads outlive the interpreter. So the group is
            # destroyed at exit at the latest, without a barrier (docs/reliability.md).
            atexit.register(self.close, wait_for_others=False)

    @property
    def distributed(self) -> bool:
        return bool(self.world > 1)

    def barrier(self) -> None:
        if self.distributed:
            self.state.wait_for_everyone()

    def share(self, n: int) -> range:
        """Indices of this process's contiguous share of ``n`` items (``n`` a multiple of the world size)."""
        size = n // self.world
        return range(self.rank * size, (self.rank + 1) * size)

    def sum(self, value: float) -> float:
        if not self.distributed:
            return value
        t = torch.tensor([float(value)], dtype=torch.float64, device=self._collective_device())
        dist.all_reduce(t)
        return float(t.item())

    def all_true(self, flag: bool) -> bool:
        return self.sum(0.0 if flag else 1.0) == 0.0

    def gather(self, obj: Any) -> list[Any]:
        """``obj`` of every process, in rank order, on every process."""
        if not self.distributed:
            return [obj]
        out: list[Any] = [None] * self.world
        dist.all_gather_object(out, obj)
        return out

    def mean_metrics(self, metrics: dict[str, float]) -> dict[str, float]:
        """Per-key mean over processes (shares have equal numbers of sequences)."""
        if not self.distributed:
            return metrics
        every = self.gather(metrics)
        keys = [k for k in metrics if all(k in m for m in every)]
        return {k: (metrics[k] if k == "step" else sum(m[k] for m in every) / self.world) for k in keys}

    def sum_gradients(self, parameters: Iterable[torch.nn.Parameter]) -> None:
        """Sum ``.grad`` over processes in one flat all-reduce (a missing grad counts as zero)."""
        if not self.distributed:
            return
        params = [p for p in parameters if p.requires_grad]
        grads = []
        for p in params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
            grads.append(p.grad)
        flat = torch.cat([g.reshape(-1) for g in grads])
        dist.all_reduce(flat)
        offset = 0
        for g in grads:
            n = g.numel()
            g.copy_(flat[offset : offset + n].view_as(g))
            offset += n

    def _collective_device(self) -> torch.device:
        return self.device if dist.get_backend() == "nccl" else torch.device("cpu")

    def scalar(self, value: torch.Tensor) -> torch.Tensor:
        """A plain tensor from a possibly sharded one (FSDP's grad norm is a DTensor)."""
        return value.full_tensor() if hasattr(value, "full_tensor") else value

    def close(self, wait_for_others: bool = True) -> None:
        """Destroy the process group (once; later calls do nothing), after a barrier so that no
        process tears down a collective another is still in. ``wait_for_others=False`` skips the
        barrier: on an error path, where another process may never reach it, and at exit."""
        # one process (world 1): nothing of ours to tear down (a vLLM engine may hold its own group)
        if self.distributed and dist.is_initialized():
            if wait_for_others:
                dist.barrier()
            for hook in _CLOSE_HOOKS:  # e.g. vLLM's groups live inside ours: they go first
                hook()
            if dist.is_initialized():
                dist.destroy_process_group()


# ---------------------------------------------------------------------------------------------
# FSDP (trainer.fsdp): parameters, gradients and optimizer state sharded over the processes


def shard_model(model: torch.nn.Module, mp_policy: MixedPrecisionPolicy | None = None) -> None:
    """FSDP2 ``fully_shard`` on every decoder layer, then on the whole model, with the mixed-precision
    policy ``mp_policy`` (``semrl.models.precision``). Gradients are reduce-scattered as plain sums (our
    losses already carry the global denominators; gloo has no pre-multiplied sum)."""
    from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard

    layers = getattr(getattr(model, "model", None), "layers", None)
    if layers is None:
        raise ValueError(
            f"trainer.fsdp: model type '{getattr(model.config, 'model_type', '?')}' has no model.layers "
            "to shard; use trainer.fsdp=false"
        )
    policy = MixedPrecisionPolicy() if mp_policy is None else mp_policy  # None: fully_shard's default
    for layer in layers:
        fully_shard(layer, mp_policy=policy)
    fully_shard(model, mp_policy=policy)
    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.set_gradient_divide_factor(1.0)
            module.set_force_sum_reduction_for_comms(True)


def is_sharded(model: torch.nn.Module) -> bool:
    """Whether ``model``'s parameters are shards (FSDP's DTensors, ``shard_model``): it cannot run a
    forward alone, only as a collective of every process."""
    return any(type(p).__name__ == "DTensor" for p in model.parameters())


def full_state_dict(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Every parameter gathered whole into CPU memory of the main process (a collective; the other
    processes get {}): no process holds the whole model on its device (docs/engines.md, GPU)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    state = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    return cast(dict[str, torch.Tensor], state)


def iter_full_parameters(model: torch.nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """Each parameter of ``model`` whole, one at a time: under FSDP each is all-gathered when its turn
    comes (a collective: every process iterates in the same order), so a consumer that keeps only the
    tensor it was given (vLLM's ``reload_weights`` with a stream, ``load_streamed``) holds one
    parameter beyond its own copy, not the whole model as ``full_state_dict`` does. A tied weight
    comes under each of its names (gathered again: vLLM loads ``lm_head.weight`` itself)."""
    from torch.distributed.tensor import DTensor

    for name, param in model.named_parameters(remove_duplicate=False):
        yield name, (param.full_tensor() if isinstance(param, DTensor) else param).detach()


def load_streamed(target: torch.nn.Module, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
    """Copy a stream of (name, full tensor) into ``target``, one tensor at a time; every parameter of
    ``target`` must come (tied ones under each name). A sharded ``target`` (FSDP, e.g. the reference
    model) keeps its own shard of each tensor, cut locally: every process has the full tensor."""
    from torch.distributed.tensor import DTensor, distribute_tensor

    params = dict(target.named_parameters(remove_duplicate=False))
    seen = set()
    with torch.no_grad():
        for name, tensor in weights:
            if name not in params:
                raise RuntimeError(f"weights do not match the rollout model: unexpected {name}")
            param = params[name]
            if isinstance(param, DTensor):
                full = tensor.to(param.device, param.dtype)
                shard = distribute_tensor(full, param.device_mesh, param.placements, src_data_rank=None)
                param.to_local().copy_(shard.to_local())
            else:
                param.copy_(tensor)
            seen.add(name)
    if set(params) - seen:
        raise RuntimeError(f"weights do not match the rollout model: missing {sorted(set(params) - seen)}")


def full_optimizer_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

    return get_optimizer_state_dict(
        model, optimizer, options=StateDictOptions(full_state_dict=True, cpu_offload=True)
    )


def load_optimizer_state(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer, state: dict[str, Any]
) -> None:
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

    set_optimizer_state_dict(model, optimizer, state, options=StateDictOptions(full_state_dict=True))
