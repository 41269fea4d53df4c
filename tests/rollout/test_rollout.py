"""The rollout engine and the training forward pass on a tiny random Llama."""

import pytest
import torch

from semrl.models.loading import load_model, load_tokenizer
from semrl.rollout.engines import GenerationRequest, SamplingParams
from semrl.rollout.engines.hf import HFEngine, filter_logits
from semrl.rollout.sequences import make_sequence_batch
from semrl.update.forward import response_logprobs


@pytest.fixture(scope="module")
def tiny(tiny_model_dir):
    tok = load_tokenizer(str(tiny_model_dir))
    model = load_model(str(tiny_model_dir))
    return tok, model, HFEngine(model, [tok.eos_token_id], tok.pad_token_id, batch_size=4)


def _prompts(tok, n):
    return [tok(f"Question {i}: what comes next?")["input_ids"] for i in range(n)]


def test_shapes_and_flags(tiny):
    tok, model, engine = tiny
    reqs = [GenerationRequest(p) for p in _prompts(tok, 6)]  # 6 > batch_size: two batches
    gens = engine.generate(
        reqs, SamplingParams(max_new_tokens=12, logprobs_top_k=20), torch.Generator().manual_seed(0)
    )
    assert len(gens) == 6
    for g in gens:
        n = len(g.token_ids)
        assert 1 <= n <= 12
        assert g.logprobs.shape == (n,) and g.entropy.shape == (n,)
        assert g.top_logprobs.shape == (n, 20) and g.top_ids.shape == (n, 20)
        assert torch.all(g.top_logprobs[:, :-1] >= g.top_logprobs[:, 1:])
        assert torch.all(g.logprobs <= g.top_logprobs[:, 0] + 1e-6)
        if g.finished:
            assert g.token_ids[-1].item() == tok.eos_token_id
        else:
            assert n == 12 and g.truncated


def test_seeded_sampling_is_repeatable(tiny):
    tok, _, engine = tiny
    reqs = [GenerationRequest(p) for p in _prompts(tok, 3)]
    params = SamplingParams(temperature=1.0, top_p=0.9, top_k=50, max_new_tokens=8)
    a = engine.generate(reqs, params, torch.Generator().manual_seed(1))
    b = engine.generate(reqs, params, torch.Generator().manual_seed(1))
    assert all(torch.equal(x.token_ids, y.token_ids) for x, y in zip(a, b, strict=False))


def test_generation_logprobs_match_training_forward(tiny):
    tok, model, engine = tiny
    prompts = _prompts(tok, 4)
    gens = engine.generate(
        [GenerationRequest(p) for p in prompts],
        SamplingParams(temperature=0.7, max_new_tokens=10),
        torch.Generator().manual_seed(2),
    )
    batch = make_sequence_batch(prompts, [g.token_ids.tolist() for g in gens], tok.pad_token_id)
    with torch.no_grad():
        logp, entropy = response_logprobs(model, batch, temperature=0.7)
    for i, g in enumerate(gens):
        n = len(g.token_ids)
        assert torch.allclose(logp[i, :n], g.logprobs, atol=1e-4)
        assert torch.allclose(entropy[i, :n], g.entropy, atol=1e-4)
        assert torch.all(logp[i, n:] == 0)


def test_prefix_continuation_matches_greedy_full_generation(tiny):
    tok, _, engine = tiny
    prompts = _prompts(tok, 3)
    greedy = SamplingParams(temperature=0.0, max_new_tokens=10)
    full = engine.generate([GenerationRequest(p) for p in prompts], greedy)
    conts = engine.generate(
        [
            GenerationRequest(p, prefix_ids=f.token_ids[:4].tolist(), max_new_tokens=6)
            for p, f in zip(prompts, full, strict=False)
        ],
        greedy,
    )
    for f, c in zip(full, conts, strict=False):
        if len(f.token_ids) > 4:
            n = len(c.token_ids)
            assert torch.equal(c.token_ids, f.token_ids[4 : 4 + n])
            assert torch.allclose(c.logprobs, f.logprobs[4 : 4 + n], atol=1e-4)


def test_filter_logits():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    assert torch.isinf(filter_logits(logits, top_k=2, top_p=1.0)[0, 2:]).all()
    kept = ~torch.isinf(filter_logits(logits, top_k=0, top_p=0.7))
    assert kept.tolist() == [[True, True, False, False]]  # 0.5 < 0.7, 0.5 + 0.3 >= 0.7
    assert (~torch.isinf(filter_logits(logits, 0, 0.1))).sum() == 1  # always keeps the top token


def test_select_trims_padding(tiny):
    tok, _, _ = tiny
    batch = make_sequence_batch([[5, 6, 7], [8]], [[1, 2], [3, 4, 9, 10]], tok.pad_token_id)
    sub = batch.select([0])
    assert sub.input_ids.tolist() == [[5, 6, 7, 1, 2]] and sub.prompt_width == 3
    assert sub.response_mask.tolist() == [[1, 1]]


def test_prefix_cache_continuation_matches_recomputed_prefix(tiny):
    """A continuation that reuses its parent's KV cache samples what re-encoding would sample."""
    tok, _, engine = tiny
    prompts = _prompts(tok, 3)
    greedy = SamplingParams(temperature=0.0, max_new_tokens=10)
    full = engine.generate([GenerationRequest(p) for p in prompts], greedy, reuse_kv_cache=True)
    for p, f in zip(prompts, full, strict=True):
        # every fed token is cached: prompt + all new tokens but the last
        assert f.cache is not None and f.cache.length == len(p) + len(f.token_ids) - 1
        assert f.cache.nbytes() > 0
    # mixed batch: two rows continue from cached parents (one at k=0), one row re-encodes its prefix
    cuts = [4, 0, 3]
    requests = [
        GenerationRequest(
            p, prefix_ids=f.token_ids[:k].tolist(), max_new_tokens=10 - k, cache=f.cache if i < 2 else None
        )
        for i, (p, f, k) in enumerate(zip(prompts, full, cuts, strict=True))
    ]
    conts = engine.generate(requests, greedy, reuse_kv_cache=True)
    for p, f, c, k in zip(prompts, full, conts, cuts, strict=True):
        n = len(c.token_ids)
        assert n >= 1 and torch.equal(c.token_ids, f.token_ids[k : k + n])
        assert torch.allclose(c.logprobs, f.logprobs[k : k + n], atol=1e-4)
        assert torch.allclose(c.entropy, f.entropy[k : k + n], atol=1e-4)
        assert c.cache is not None and c.cache.length == len(p) + k + n - 1
        # the child's cache holds the same prefix states as the parent's
        m = min(c.cache.length, f.cache.length)
        assert torch.allclose(c.cache.keys[0][:, :m], f.cache.keys[0][:, :m], atol=1e-4)


def test_finished_rows_leave_the_batch_without_changing_results(tiny):
    """Greedy outputs do not depend on which other rows share the batch (compaction is exact)."""
    tok, model, _ = tiny
    prompts = _prompts(tok, 5)
    greedy = SamplingParams(temperature=0.0, max_new_tokens=12)
    alone = [
        HFEngine(model, [tok.eos_token_id], tok.pad_token_id, 1).generate([GenerationRequest(p)], greedy)[0]
        for p in prompts
    ]
    budgets = [3, 12, 5, 12, 1]  # rows leave at different steps
    together = HFEngine(model, [tok.eos_token_id], tok.pad_token_id, 8).generate(
        [GenerationRequest(p, max_new_tokens=b) for p, b in zip(prompts, budgets, strict=True)], greedy
    )
    for a, t, b in zip(alone, together, budgets, strict=True):
        n = min(b, len(a.token_ids))
        assert len(t.token_ids) == n
        assert torch.equal(t.token_ids, a.token_ids[:n])
        assert torch.allclose(t.logprobs, a.logprobs[:n], atol=1e-4)


def test_invalid_requests_are_rejected(tiny):
    _, _, engine = tiny
    with pytest.raises(ValueError, match="empty prompt"):
        engine.generate([GenerationRequest([])], SamplingParams())
    with pytest.raises(ValueError, match="max_new_tokens"):
        engine.generate([GenerationRequest([1, 2], max_new_tokens=0)], SamplingParams())


def test_the_cache_goes_by_the_name_the_installed_transformers_takes(tiny):
    """transformers 5.2x renamed forward's ``past_key_values`` to ``cache`` and warns on the old
    name at every decoding step (issue 64, item 4): the engine asks the model's forward, with
    LoRA adapters too, and sampling prints no FutureWarning."""
    import inspect
    import warnings

    from semrl.config.sections import ModelConfig
    from semrl.models.lora import add_adapters
    from semrl.rollout.engines.kv_cache import with_cache

    class NewStyle(torch.nn.Module):
        def forward(self, input_ids, cache=None, use_cache=False): ...

    class OldStyle(torch.nn.Module):
        def forward(self, input_ids, past_key_values=None, use_cache=False): ...

    assert with_cache(NewStyle(), "kv") == {"cache": "kv"}
    assert with_cache(OldStyle(), "kv") == {"past_key_values": "kv"}
    tok, model, engine = tiny
    expected = "cache" if "cache" in inspect.signature(type(model).forward).parameters else "past_key_values"
    assert list(with_cache(model, "kv")) == [expected]
    lora = load_model(str(model.name_or_path))
    add_adapters(lora, ModelConfig(lora_r=4, lora_alpha=8))
    assert list(with_cache(lora, "kv")) == [expected]
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)
        for sampler in (engine, HFEngine(lora, [tok.eos_token_id], tok.pad_token_id, batch_size=4)):
            sampler.generate(
                [GenerationRequest(p) for p in _prompts(tok, 2)],
                SamplingParams(max_new_tokens=4),
                torch.Generator().manual_seed(0),
            )
