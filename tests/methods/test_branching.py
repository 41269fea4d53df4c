"""ROSE branching scores on tiny vocabularies with known embeddings (hand-computed)."""

import math

import pytest
import torch

from semrl.methods.rose.branching import (
    branch_scores,
    normalized_embeddings,
    pairwise_similarity_mass,
    semantic_divergence,
    topk_entropy,
)

ORTHO = normalized_embeddings(torch.eye(4) * 3.0)  # 4 tokens, mutually orthogonal
SAME = normalized_embeddings(torch.ones(4, 2) * torch.tensor([[1.0], [2.0], [3.0], [4.0]]))  # all parallel
LOGP = torch.log(torch.tensor([[0.5, 0.3, 0.2]]))
IDS = torch.tensor([[0, 1, 2]])


def test_embeddings_are_unit_norm():
    assert torch.allclose(SAME.norm(dim=-1), torch.ones(4))


def test_topk_entropy_by_hand():
    expected = -(0.5 * math.log(0.5) + 0.3 * math.log(0.3) + 0.2 * math.log(0.2))
    assert topk_entropy(LOGP).item() == pytest.approx(expected, rel=1e-6)


def test_orthogonal_candidates():
    f, m = pairwise_similarity_mass(LOGP, IDS, ORTHO)
    assert f.item() == pytest.approx(0.0, abs=1e-7)
    assert m.item() == pytest.approx(1.0 - (0.25 + 0.09 + 0.04))  # sum_{i!=j} p_i p_j = 0.62
    assert semantic_divergence(LOGP, IDS, ORTHO, "rose").item() == pytest.approx(0.0, abs=1e-7)
    assert semantic_divergence(LOGP, IDS, ORTHO, "normalized").item() == pytest.approx(1.0)


def test_identical_candidates():
    # cos = 1 for every pair: F = sum_{i != j} p_i p_j = 0.62
    assert semantic_divergence(LOGP, IDS, SAME, "rose").item() == pytest.approx(-0.62, rel=1e-5)
    assert semantic_divergence(LOGP, IDS, SAME, "normalized").item() == pytest.approx(0.0, abs=1e-6)


def test_anti_aligned_pair_by_hand():
    emb = normalized_embeddings(torch.tensor([[1.0, 0.0], [-1.0, 0.0], [0.0, 1.0]]))
    logp = torch.log(torch.tensor([[0.6, 0.4]]))
    # F = 2 * 0.6 * 0.4 * cos(pi) = -0.48  -> SD = 0.48; normalised: 1 - (-0.48 / 0.48) = 2
    assert semantic_divergence(logp, torch.tensor([[0, 1]]), emb, "rose").item() == pytest.approx(
        0.48, rel=1e-6
    )
    assert semantic_divergence(logp, torch.tensor([[0, 1]]), emb, "normalized").item() == pytest.approx(2.0)


def test_diagonal_excluded_deterministic_position_scores_zero():
    logp = torch.log(torch.tensor([[1.0 - 1e-6, 1e-6]]))
    score, h, sd = branch_scores(logp, torch.tensor([[0, 1]]), SAME)
    assert abs(sd.item()) < 1e-5 and h.item() < 1e-4 and abs(score.item()) < 1e-8


def test_metrics_and_modes():
    logp = torch.log(torch.tensor([[0.5, 0.5, 0.0 + 1e-9], [0.9, 0.05, 0.05]]))
    ids = torch.tensor([[0, 1, 2], [0, 1, 2]])
    score, h, sd = branch_scores(logp, ids, ORTHO, metric="semantic_entropy", sd_mode="normalized")
    assert torch.allclose(score, sd * h)
    assert torch.equal(branch_scores(logp, ids, ORTHO, metric="entropy")[0], h)
    assert torch.equal(branch_scores(logp, ids, ORTHO, metric="divergence", sd_mode="normalized")[0], sd)
    full = torch.tensor([2.0, 3.0])
    s_full, h_full, _ = branch_scores(
        logp, ids, ORTHO, metric="entropy", entropy_mode="full_vocab", full_entropy=full
    )
    assert torch.equal(s_full, full) and torch.equal(h_full, full)
    r1 = branch_scores(logp, ids, ORTHO, metric="random", generator=torch.Generator().manual_seed(0))[0]
    r2 = branch_scores(logp, ids, ORTHO, metric="random", generator=torch.Generator().manual_seed(0))[0]
    assert torch.equal(r1, r2) and r1.shape == (2,)
    # sd_top_k limits the candidates: with only the top-1, there are no pairs
    assert torch.all(branch_scores(logp, ids, SAME, sd_top_k=1)[2].abs() < 1e-6)
    with pytest.raises(ValueError, match="full_entropy"):
        branch_scores(logp, ids, ORTHO, entropy_mode="full_vocab")
    with pytest.raises(ValueError, match="branch metric"):
        branch_scores(logp, ids, ORTHO, metric="bogus")  # type: ignore[arg-type]


def test_matches_explicit_double_sum():
    torch.manual_seed(0)
    emb = normalized_embeddings(torch.randn(50, 8))
    logits = torch.randn(3, 50)
    top_lp, top_ids = torch.topk(torch.log_softmax(logits, -1), 20, dim=-1)
    fast = semantic_divergence(top_lp, top_ids, emb, "rose")
    for row in range(3):
        p = top_lp[row].exp()
        e = emb[top_ids[row]]
        cos = e @ e.T
        slow = -sum(p[i] * p[j] * cos[i, j] for i in range(20) for j in range(20) if i != j)
        assert fast[row].item() == pytest.approx(slow.item(), rel=1e-4, abs=1e-6)


def test_entropy_with_sampled_adds_the_21st_entry_like_the_rose_code():
    """Reference: the ROSE code's dictionary of top-k entries plus the sampled token's entry when it
    is outside them, summed as -p log p; random cases with the sampled token inside and outside."""
    from semrl.methods.rose.branching import branch_scores

    gen = torch.Generator().manual_seed(0)
    vocab, k = 50, 5
    emb = torch.nn.functional.normalize(torch.randn(vocab, 8, generator=gen), dim=-1)
    for _ in range(200):
        length = int(torch.randint(1, 9, (1,), generator=gen))
        logp_all = torch.log_softmax(torch.randn(length, vocab, generator=gen) * 2, -1)
        top_lp, top_ids = torch.topk(logp_all, k, -1)
        ids = torch.multinomial(logp_all.exp(), 1, generator=gen).squeeze(-1)
        logps = logp_all.gather(-1, ids[:, None]).squeeze(-1)
        _, entropy, _ = branch_scores(top_lp, top_ids, emb, sd_top_k=k, sampled=(ids, logps))
        for t in range(length):
            entries = {int(i): float(lp) for i, lp in zip(top_ids[t], top_lp[t], strict=True)}
            entries.setdefault(int(ids[t]), float(logps[t]))
            reference = -sum(math.exp(lp) * lp for lp in entries.values())
            assert abs(float(entropy[t]) - reference) < 1e-5
        _, plain, _ = branch_scores(top_lp, top_ids, emb, sd_top_k=k)
        inside = (top_ids == ids[:, None]).any(-1)
        assert torch.equal(plain[inside], entropy[inside]) and bool((entropy[~inside] > plain[~inside]).all())
