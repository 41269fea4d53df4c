"""Chunked log-probs and entropies (semrl.update.lm_head) against the full-logits computation."""

from __future__ import annotations

import pytest
import torch

from semrl.update.lm_head import chunked_logprobs
from tests.helpers import dense_attention_mask


def full_reference(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    targets: torch.Tensor,
    temperature: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The textbook computation in float64: all logits, log_softmax, gather."""
    logits = hidden.double() @ weight.double().T
    if bias is not None:
        logits = logits + bias.double()
    logp_all = torch.log_softmax(logits / temperature, dim=-1)
    logp = logp_all.gather(-1, targets[:, None]).squeeze(-1)
    entropy = -(logp_all.exp() * logp_all).sum(-1)
    return logp, entropy


@pytest.mark.parametrize("seed", range(12))
def test_chunked_equals_full_values_and_gradients(seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    rows = int(torch.randint(1, 70, (1,), generator=gen))
    hidden_size = int(torch.randint(2, 24, (1,), generator=gen))
    vocab = int(torch.randint(2, 3000, (1,), generator=gen))
    chunk = int(torch.randint(1, 2 * rows + 1, (1,), generator=gen))  # below, at and above the row count
    temperature = [1.0, 0.6, 1.3][seed % 3]
    scale = [0.1, 1.0, 8.0][seed % 3]  # peaked and flat distributions
    hidden = (torch.randn(rows, hidden_size, generator=gen) * scale).requires_grad_()
    weight = torch.randn(vocab, hidden_size, generator=gen).requires_grad_()
    bias = torch.randn(vocab, generator=gen).requires_grad_() if seed % 2 else None
    targets = torch.randint(0, vocab, (rows,), generator=gen)
    # upstream gradient: signed, with zero rows (padding / tokens outside the loss)
    upstream = torch.randn(rows, generator=gen) * (torch.rand(rows, generator=gen) > 0.3)

    logp, entropy = chunked_logprobs(
        hidden, weight, targets, bias=bias, temperature=temperature, chunk_size=chunk
    )
    ref_logp, ref_entropy = full_reference(hidden, weight, bias, targets, temperature)
    assert logp.dtype == torch.float32 and entropy is not None and entropy.requires_grad
    torch.testing.assert_close(logp.double(), ref_logp.detach(), rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(entropy.double(), ref_entropy.detach(), rtol=1e-5, atol=1e-4)

    params = [hidden, weight] + ([bias] if bias is not None else [])
    # the entropy's own upstream gradient (the entropy bonus), signed, with other zero rows
    upstream_h = torch.randn(rows, generator=gen) * (torch.rand(rows, generator=gen) > 0.3)
    for w_logp, w_h in [(1.0, 0.0), (0.0, 1.0), (1.0, 1.0)]:  # log-probs only, entropy only, both
        loss = (logp * upstream * w_logp).sum() + (entropy * upstream_h * w_h).sum()
        ref_loss = (ref_logp * upstream.double() * w_logp).sum() + (
            ref_entropy * upstream_h.double() * w_h
        ).sum()
        grads = torch.autograd.grad(loss, params, retain_graph=True)
        ref_grads = torch.autograd.grad(ref_loss, params, retain_graph=True)
        for got, want in zip(grads, ref_grads, strict=True):
            assert got.dtype == torch.float32
            torch.testing.assert_close(got.double(), want.double(), rtol=1e-4, atol=1e-5)


def test_large_vocabulary_and_no_entropy() -> None:
    gen = torch.Generator().manual_seed(7)
    hidden = torch.randn(40, 16, generator=gen, requires_grad=True)
    weight = (torch.randn(60_000, 16, generator=gen) * 0.5).requires_grad_()
    targets = torch.randint(0, 60_000, (40,), generator=gen)
    logp, entropy = chunked_logprobs(hidden, weight, targets, with_entropy=False, chunk_size=7)
    assert entropy is None
    ref_logp, _ = full_reference(hidden, weight, None, targets, 1.0)
    torch.testing.assert_close(logp.double(), ref_logp.detach(), rtol=1e-5, atol=1e-4)
    got = torch.autograd.grad(logp.sum(), [hidden, weight])
    want = torch.autograd.grad(ref_logp.sum(), [hidden, weight])
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g.double(), w.double(), rtol=1e-3, atol=1e-5)


def test_only_hidden_or_only_weight_needs_grad() -> None:
    gen = torch.Generator().manual_seed(3)
    hidden = torch.randn(9, 5, generator=gen)
    weight = torch.randn(30, 5, generator=gen)
    targets = torch.randint(0, 30, (9,), generator=gen)
    for needs in ("hidden", "weight"):
        h = hidden.clone().requires_grad_(needs == "hidden")
        w = weight.clone().requires_grad_(needs == "weight")
        logp, _ = chunked_logprobs(h, w, targets, chunk_size=4)
        (grad,) = torch.autograd.grad(logp.sum(), [h if needs == "hidden" else w])
        ref, _ = full_reference(h, w, None, targets, 1.0)
        (want,) = torch.autograd.grad(ref.sum(), [h if needs == "hidden" else w])
        torch.testing.assert_close(grad.double(), want.double(), rtol=1e-4, atol=1e-6)


def test_bf16_autocast_matches_the_autocast_full_computation() -> None:
    """Under autocast the head matmul runs in bf16, as the model's own LM head would; softmax in fp32."""
    gen = torch.Generator().manual_seed(11)
    hidden = torch.randn(33, 32, generator=gen, requires_grad=True)
    weight = (torch.randn(500, 32, generator=gen) * 0.2).requires_grad_()
    targets = torch.randint(0, 500, (33,), generator=gen)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logp, entropy = chunked_logprobs(hidden, weight, targets, chunk_size=8)
        full_logits = hidden @ weight.T
    assert full_logits.dtype == torch.bfloat16
    ref = torch.log_softmax(full_logits.float(), -1).gather(-1, targets[:, None]).squeeze(-1)
    torch.testing.assert_close(logp, ref, rtol=0, atol=1e-5)
    got = torch.autograd.grad(logp.sum(), [hidden, weight])
    want = torch.autograd.grad(ref.sum(), [hidden, weight])
    for g, w in zip(got, want, strict=True):
        assert g.dtype == torch.float32  # gradients land in the fp32 parameters' dtype
        torch.testing.assert_close(g, w, rtol=2e-2, atol=2e-2)


def test_bad_shapes_are_named() -> None:
    with pytest.raises(ValueError, match="hidden \\(M, H\\)"):
        chunked_logprobs(torch.zeros(3, 4), torch.zeros(10, 5), torch.zeros(3, dtype=torch.long))
    with pytest.raises(ValueError, match="chunk_size"):
        chunked_logprobs(
            torch.zeros(3, 4), torch.zeros(10, 4), torch.zeros(3, dtype=torch.long), chunk_size=0
        )


def _full_logits_logprobs(
    model, input_ids, attention_mask, position_ids, columns, rows, targets, mask, temperature
):
    """Independent reference: the model's own full logits at every position, then log_softmax."""
    logits = model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids).logits
    logp_all = torch.log_softmax(logits[rows, columns].float() / temperature, dim=-1)
    logp = logp_all.gather(-1, targets[..., None]).squeeze(-1) * mask
    entropy = -(logp_all.exp() * logp_all).sum(-1) * mask
    return logp, entropy


@pytest.mark.parametrize("layout", ["padded", "packed"])
def test_model_forward_with_chunks_equals_full_logits(tiny_model_dir, layout):
    """The training forward (hidden states + chunked head, chunk of 5 tokens) against the model's own
    logits: log-probs, entropies and every parameter's gradient, padded rows and packed trees."""
    from transformers import AutoModelForCausalLM

    from semrl.rollout.sequences import make_sequence_batch
    from semrl.rollout.tree import ChainTree
    from semrl.update.forward import response_logprobs
    from semrl.update.packing import pack_trees, packed_response_logprobs

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    gen = torch.Generator().manual_seed(5)
    vocab = model.config.vocab_size
    prompts = [torch.randint(0, vocab, (n,), generator=gen).tolist() for n in (4, 9, 6)]
    responses = [torch.randint(0, vocab, (n,), generator=gen).tolist() for n in (7, 1, 12)]
    temperature = 0.8
    if layout == "padded":
        batch = make_sequence_batch(prompts, responses, pad_token_id=0)
        ids, att = batch.input_ids, batch.attention_mask
        positions = (att.cumsum(-1) - 1).clamp(min=0)
        p, r = batch.prompt_width, batch.response_mask.shape[1]
        columns = torch.arange(p - 1, p + r - 1).expand(len(prompts), r)
        rows = torch.arange(len(prompts))[:, None].expand_as(columns)
        targets, mask = ids[:, p:], batch.response_mask.float()
        run = lambda: response_logprobs(model, batch, temperature, chunk_size=5)  # noqa: E731
        reference_inputs = (ids, att, positions)
    else:  # one group: a chain, a branch of it, and an independent chain
        chains = [responses[2], responses[2][:5] + responses[0], responses[1]]
        tree = ChainTree((-1, 0, -1), (-1, 5, 0), tuple(len(c) for c in chains))
        batch = pack_trees([prompts[1]], [chains], [tree], pad_token_id=0)
        columns = batch.predictor.clamp(min=0)
        rows = batch.row[:, None].expand_as(columns)
        targets, mask = batch.targets, batch.response_mask.float()
        run = lambda: packed_response_logprobs(model, batch, temperature, chunk_size=5)  # noqa: E731
        reference_inputs = (batch.input_ids, dense_attention_mask(batch, torch.float32), batch.position_ids)
    adv = torch.randn(mask.shape, generator=gen)

    logp, entropy = run()
    grads = torch.autograd.grad((logp * adv).sum(), list(model.parameters()))
    ref_logp, ref_entropy = _full_logits_logprobs(
        model, *reference_inputs, columns, rows, targets, mask, temperature
    )
    ref_grads = torch.autograd.grad((ref_logp * adv).sum(), list(model.parameters()))
    torch.testing.assert_close(logp, ref_logp, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(entropy, ref_entropy, rtol=1e-5, atol=1e-5)
    for got, want in zip(grads, ref_grads, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-3, atol=5e-5)
