"""The ``vllm`` engine (docs/engines.md): vLLM colocated in the training process.

- ``engine``: ``VLLMEngine``, the ``Engine`` it is; its weights follow the trained model's.
- ``drive``: one sampling call, the loop ``LLM.generate`` runs with semrl's callbacks inside it.
- ``start``: starting vLLM, and the one engine per process and model shape that later engines reuse.
- ``fork``: a child request that continues its parent's KV, partial block included.
- ``entropy``: the full-vocabulary entropy that vLLM's sampler records for a request that asks.
- ``state``: what the package keeps for the whole process, in one place.

What vLLM returns, and how it maps onto ``Generation``:
- ``logprobs``: ``logprobs_mode="processed_logprobs"`` gives log-probs after temperature and
  top-p/top-k. With top_p = 1 and top_k = 0 that is exactly the trainer's definition (tempered,
  unfiltered); with top_p < 1 or top_k > 0 it is the renormalised filtered distribution, which
  training refuses (``semrl.config.engine_checks``) and evaluation does not read.
- ``top_logprobs`` / ``top_ids``: the k entries of rank 1..k (vLLM adds the sampled token as a
  (k+1)-th entry when it is outside the top k; that entry is dropped here, and ROSE's
  ``rose.entropy_with_sampled`` puts it back from ``logprobs`` as the ROSE code does).
- ``entropy``: recorded by vLLM's sampler for a request that asks (``GenerationRequest.entropy``,
  ``entropy``), else None: the trainer measures it (``semrl.update.row_logprobs.with_sampling_entropy``,
  the update's forwards).

Importing the package imports no vLLM: ``start.import_vllm`` does, when an engine is built.
"""

from semrl.rollout.engines.vllm.engine import VLLMEngine
from semrl.rollout.engines.vllm.start import VLLMSettings

__all__ = ["VLLMEngine", "VLLMSettings"]
