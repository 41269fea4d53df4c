"""Mixed precision: float32 master weights under bfloat16 / float16 compute (docs/training.md "Precision").

``model.dtype`` names the compute dtype. With ``model.master_weights`` (the default) the trained
parameters, their gradients and the AdamW state stay float32; forwards and backwards compute in
``model.dtype``: under ``torch.autocast`` in one process or with gradients summed over processes,
and through FSDP2's ``MixedPrecisionPolicy`` (bf16 all-gather and compute, fp32 gradient
reduce-scatter) with ``trainer.fsdp``. float16 adds dynamic loss scaling (``torch.amp.GradScaler``).
The rollout engine and the reference model hold ``model.dtype`` weights.
"""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from torch.distributed.fsdp import MixedPrecisionPolicy

    from semrl.config.sections import Config

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def active_dtype(tensor: torch.Tensor) -> torch.dtype:
    """The dtype an op on ``tensor`` computes in: the autocast dtype where autocast is on for its
    device, else its own."""
    device_type = tensor.device.type
    return torch.get_autocast_dtype(device_type) if torch.is_autocast_enabled(device_type) else tensor.dtype


def autocast_to(dtype: torch.dtype, model: torch.nn.Module) -> AbstractContextManager[Any]:
    """Autocast to ``dtype`` when ``model``'s parameters are of a wider dtype; else nothing."""
    param = next(model.parameters())
    if dtype == torch.float32 or param.dtype == dtype:
        return nullcontext()
    return torch.autocast(param.device.type, dtype=dtype)


@dataclass(frozen=True)
class Precision:
    """Attributes:
    compute: dtype of forward and backward matmuls (``model.dtype``).
    params: dtype of the trained parameters, gradients and optimizer state.
    sharded: FSDP casts the parameters itself (no autocast).
    """

    compute: torch.dtype
    params: torch.dtype
    sharded: bool = False

    @classmethod
    def from_config(cls, cfg: Config) -> Precision:
        if cfg.model.dtype not in DTYPES:
            raise ValueError(
                f"model.dtype={cfg.model.dtype} is not resolved: a Trainer resolves it "
                "(semrl.runtime.setup.resolve_dtype); code that loads models itself names a dtype"
            )
        compute = DTYPES[cfg.model.dtype]
        params = torch.float32 if cfg.model.master_weights else compute
        return cls(compute, params, bool(cfg.trainer.fsdp))

    @property
    def params_name(self) -> str:
        return next(k for k, v in DTYPES.items() if v == self.params)

    def autocast(self, model: torch.nn.Module) -> AbstractContextManager[Any]:
        """The context for the trained model's forwards: autocast to the compute dtype over
        float32 parameters; nothing under FSDP (its policy casts) or without mixed precision."""
        if self.sharded or self.compute == self.params:
            return nullcontext()
        return autocast_to(self.compute, model)

    def fsdp_policy(self) -> MixedPrecisionPolicy:
        """FSDP2's policy: all-gather and compute in the compute dtype, reduce gradients in fp32."""
        from torch.distributed.fsdp import MixedPrecisionPolicy

        if self.compute == self.params:
            return MixedPrecisionPolicy()
        return MixedPrecisionPolicy(param_dtype=self.compute, reduce_dtype=torch.float32)

    def grad_scaler(self, device: torch.device) -> torch.amp.GradScaler:
        """Dynamic loss scaling for float16 compute (gradients below fp16's range would vanish);
        disabled, a pass-through, for other dtypes."""
        return torch.amp.GradScaler(device.type, enabled=self.compute == torch.float16)
