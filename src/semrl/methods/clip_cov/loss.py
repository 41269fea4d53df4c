"""Clip-Cov's policy loss (``algorithm.policy_loss=clip_cov``): ``semrl.methods.token_losses.clip_cov_loss``
with the options of the ``clip_cov`` section."""

from __future__ import annotations

import torch

from semrl.methods.clip_cov import ClipCovConfig
from semrl.methods.policy_loss import PolicyLossInputs, clip_range
from semrl.methods.registry import MethodConfig
from semrl.methods.token_losses import clip_cov_loss


def clip_cov(
    x: PolicyLossInputs, config: MethodConfig[ClipCovConfig]
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    a, c = config.algorithm, config.options
    return clip_cov_loss(
        x.logp, x.old_logp, x.advantages, x.mask, *clip_range(a), c.ratio, c.lb, c.ub, x.generator
    )
