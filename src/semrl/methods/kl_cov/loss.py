"""KL-Cov's policy loss (``algorithm.policy_loss=kl_cov``): ``semrl.methods.token_losses.kl_cov_loss``
with the options of the ``kl_cov`` section.
"""

from __future__ import annotations

import torch

from semrl.methods.kl_cov import KLCovConfig
from semrl.methods.policy_loss import PolicyLossInputs
from semrl.methods.registry import MethodConfig
from semrl.methods.token_losses import kl_cov_loss


def kl_cov(
    x: PolicyLossInputs, config: MethodConfig[KLCovConfig]
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    o = config.options
    return kl_cov_loss(x.logp, x.old_logp, x.advantages, x.mask, o.ratio, o.ppo_kl_coef)
