"""The entropy vLLM's sampler records (``semrl.rollout.engines.vllm.entropy``; docs/engines.md,
"Entropy on vllm"): a request that asks gets the full-vocabulary entropy of its tempered
distributions, which is the trainer's forward's to float rounding, at every position, forked or not;
no token or log-prob changes; no record outlives its call; FR3E's anchors need no forward."""

from __future__ import annotations

import random
from dataclasses import replace
from functools import partial
from typing import Any

import pytest
import torch

from semrl.methods.registry import load
from semrl.models.loading import load_model, load_tokenizer
from semrl.rollout.engines import Generation, GenerationRequest, SamplingParams
from semrl.rollout.engines.vllm import state as vllm_state
from semrl.rollout.engines.vllm.start import import_vllm
from semrl.rollout.tree_kit import Node, TreeSampler
from semrl.update.row_logprobs import with_sampling_entropy
from tests.helpers import tiny_vllm_engine, tree_method_context, vllm_or_skip


def _recorder() -> Any:
    """``semrl.rollout.engines.vllm.entropy``, imported once vLLM is set up (it imports vLLM)."""
    vllm_or_skip()
    import_vllm()
    from semrl.rollout.engines.vllm import entropy as vllm_entropy

    return vllm_entropy


@pytest.fixture(scope="module")
def setup(tiny32_model_dir):
    vllm_or_skip()
    return load_tokenizer(str(tiny32_model_dir)), load_model(str(tiny32_model_dir))


def _engine(model, tok, sampler_entropy=True):
    return tiny_vllm_engine(model, tok, vllm_sampler_entropy=sampler_entropy)


def _forward_entropy(model, engine, context: list[int], out: Generation, temperature: float) -> torch.Tensor:
    plain = replace(out, entropy=None)
    entropy = partial(
        with_sampling_entropy, model, temperature=temperature, compute_dtype=engine.compute_dtype
    )
    measured = entropy([context], [plain])[0].entropy
    assert measured is not None
    return measured


def _tree(engine, prompts, params, asks):
    """Per prompt a chain of 20-41 tokens, then three children forked from it at random positions; the
    nodes whose index is in ``asks`` ask for their entropy. Returns the kit."""
    rng = random.Random(0)
    kit = TreeSampler(engine, prompts, params, None, list(range(len(prompts))), reuse_kv_cache=True)

    def on_node(node: Node) -> list[Node]:
        if node.index:
            return []
        tree = kit.trees[node.prompt]
        length = len(node.response().token_ids)
        kids = [
            tree.add(i, node, rng.randint(0, length), budget=rng.randint(4, 20), entropy=i in asks)
            for i in (1, 2, 3)
        ]
        kit.close(node.prompt)
        return kids

    # budgets that differ, so that rows finish at different steps and vLLM moves the others in its batch
    kit.run([tree.add(0, budget=20 + 3 * tree.prompt, entropy=0 in asks) for tree in kit.trees], on_node)
    return kit


@pytest.mark.parametrize("temperature", [0.7, 1.0, 1.3])
def test_a_request_that_asks_gets_the_trainers_entropy_and_the_same_tokens(setup, temperature):
    """On 8 prompts of random lengths, chains and forked children: every position of a request that
    asked holds the forward's entropy (to 1e-4); one that did not ask has none; tokens and log-probs
    equal those of an engine that records nothing; no record is left."""
    tok, model = setup
    rng = random.Random(int(temperature * 10))
    vocab = model.config.vocab_size
    prompts = [[rng.randrange(3, vocab) for _ in range(rng.randint(3, 70))] for _ in range(8)]
    params = SamplingParams(temperature=temperature, max_new_tokens=60, logprobs_top_k=2)
    asks = {0, 2}
    recorded = _tree(_engine(model, tok), prompts, params, asks)
    plain = _tree(_engine(model, tok, sampler_entropy=False), prompts, params, asks)
    assert _recorder().recording() == 0
    checked = 0
    for tree, other in zip(recorded.trees, plain.trees, strict=True):
        for index, node in tree.nodes.items():
            twin = other.nodes[index]
            assert node.out is not None and twin.out is not None
            assert node.out.token_ids.tolist() == twin.out.token_ids.tolist()
            assert torch.equal(node.out.logprobs, twin.out.logprobs)
            assert twin.out.entropy is None
            if index not in asks:
                assert node.out.entropy is None
                continue
            assert node.out.entropy is not None and len(node.out.entropy) == len(node.out.token_ids)
            expected = _forward_entropy(model, recorded.engine, recorded.context(node), node.out, temperature)
            torch.testing.assert_close(node.out.entropy, expected, atol=1e-4, rtol=1e-4)
            checked += len(expected)
    assert checked > 8 * 20


def test_a_greedy_request_is_not_recorded_and_a_raising_callback_leaves_no_record(setup):
    """Greedy rows are not tempered by vLLM's sampler: they get no entropy (the forward gives it). A
    callback that raises mid-call leaves no record behind."""
    tok, model = setup
    engine = _engine(model, tok)
    prompt = tok("Entropy case: one two three")["input_ids"]
    greedy = SamplingParams(temperature=0.0, max_new_tokens=8, logprobs_top_k=2)
    out = engine.generate([GenerationRequest(prompt, seed=1, entropy=True)], greedy)[0]
    assert out.entropy is None and _recorder().recording() == 0

    sampled = SamplingParams(temperature=1.0, max_new_tokens=30, logprobs_top_k=2)
    requests = [
        (i, GenerationRequest(prompt, max_new_tokens=4 if i == 0 else 30, seed=i, entropy=True))
        for i in range(4)
    ]

    def on_done(tag, request, out):  # noqa: ANN001, ANN202
        raise RuntimeError("the method's callback failed")

    with pytest.raises(RuntimeError, match="callback failed"):
        engine.generate_dynamic(requests, sampled, None, on_done)
    assert _recorder().recording() == 0


def test_the_switch_starts_vllm_without_the_processor(setup):
    """``rollout.vllm_sampler_entropy=false`` is another engine, started without the logits processor
    (on a GPU any custom processor costs every step a copy); the default one has it."""
    tok, model = setup
    recording, plain = _engine(model, tok), _engine(model, tok, sampler_entropy=False)
    assert recording.llm is not plain.llm

    def processors(engine):  # noqa: ANN001, ANN202
        return engine.llm.llm_engine.vllm_config.model_config.logits_processors or []

    assert _recorder().processor_class() in processors(recording)
    assert processors(plain) == []


@pytest.mark.parametrize("method", ["fr3e", "rose"])
def test_fr3e_and_rose_read_the_engines_entropy_without_a_forward(setup, method):
    """FR3E's anchors and ROSE's full-vocabulary scores take the sampler's entropy: the trainer's
    forward is not called; with ``rollout.vllm_sampler_entropy=false`` it is, once per chain."""
    tok, model = setup
    prompts = [tok("Entropy case: " + "and so on " * n)["input_ids"] for n in (2, 5, 9)]
    extra = {"fr3e": ["fr3e.num_anchors=2"], "rose": ["rose.entropy_mode=full_vocab"]}[method]
    calls = []
    for sampler_entropy in (True, False):
        engine = _engine(model, tok, sampler_entropy)
        spec, ctx = tree_method_context(engine, tok, model, method, extra)
        forward = ctx.sampling_entropy

        def counted(contexts, generations, forward=forward, on=sampler_entropy):  # noqa: ANN001, ANN202
            calls.append((on, len(generations)))
            return forward(contexts, generations)

        ctx = replace(ctx, sampling_entropy=counted)
        load(spec.rollout_fn)(ctx, prompts)
    assert not [c for c in calls if c[0]]
    chains = 3 if method == "fr3e" else 3 * 4
    assert sum(n for on, n in calls if not on) == chains


@pytest.mark.e2e  # importing vLLM starts a process (its platform probe)
def test_the_recorder_follows_its_rows_through_random_batch_updates():
    """300 steps of random removals, additions (some asking), one-way moves and swaps, as vLLM's
    persistent batch makes them, against a reference batch of request ids: each asking request's
    record holds, at each of its positions, the entropy of the row it sat in (torch's Categorical)."""
    recorder = _recorder()
    from vllm import SamplingParams as VLLMSamplingParams
    from vllm.v1.sample.logits_processor import BatchUpdate, MoveDirectionality

    rng, rows = random.Random(0), 12
    processor = recorder.processor_class()(None, torch.device("cpu"), False)
    batch: list[str | None] = [None] * rows  # the reference: the request in each row
    outputs: dict[str, list[int]] = {}
    expected: dict[str, list[float]] = {}
    for step in range(300):
        removed = [row for row in range(rows) if batch[row] is not None and rng.random() < 0.15]
        for row in removed:
            batch[row] = None
        added = []
        for row in range(rows):
            if (batch[row] is None and rng.random() < 0.5) or rng.random() < 0.03:  # or replaced in place
                request_id = f"r{step}-{row}"
                asks = rng.random() < 0.6
                extra = {recorder.ENTROPY_KEY: request_id} if asks else None
                outputs[request_id] = []
                if asks:
                    expected[request_id] = []
                added.append((row, VLLMSamplingParams(extra_args=extra), None, outputs[request_id]))
                batch[row] = request_id
        moved = []
        for _ in range(rng.randint(0, 3)):
            a, b = rng.sample(range(rows), 2)
            if rng.random() < 0.5:
                moved.append((a, b, MoveDirectionality.SWAP))
                batch[a], batch[b] = batch[b], batch[a]
            elif batch[a] is not None:
                moved.append((a, b, MoveDirectionality.UNIDIRECTIONAL))
                batch[a], batch[b] = None, batch[a]
        processor.update_state(BatchUpdate(rows, removed, added, moved))
        logits = torch.randn(rows, 40) * rng.choice([0.1, 1.0, 8.0])
        processor.apply(logits.clone())
        for row, request_id in enumerate(batch):
            if request_id is None:
                continue
            if request_id in expected:
                expected[request_id].append(
                    float(torch.distributions.Categorical(logits=logits[row]).entropy())
                )
            outputs[request_id].append(step)  # its sampled token
    assert sum(len(v) for v in expected.values()) > 1000
    for request_id, values in expected.items():
        assert len(vllm_state.ENTROPY_RECORDS.get(request_id, [])) == len(
            values
        )  # no row it left wrote to it
        got = recorder.take(request_id, len(outputs[request_id]))
        assert got is not None, request_id
        torch.testing.assert_close(got, torch.tensor(values), atol=1e-5, rtol=1e-5)
    assert recorder.recording() == 0
