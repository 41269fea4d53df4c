"""ROSE segment advantages on hand-built trees with hand-computed node values."""

import random

import pytest
import torch

from semrl.methods.advantages import group_centered_rewards
from semrl.methods.rose.advantages import length_discount, segment_advantages
from semrl.rollout.tree import ChainTree, code_compat_node_sets, exact_node_points

# Tree A: 0 root (L 30); 1 from 0 at 10 (L 25); 2 fresh (L 20); 3 from 1 at 20 (L 28).
TREE_A = ChainTree(parents=(-1, 0, -1, 1), branch_positions=(-1, 10, 0, 20), lengths=(30, 25, 20, 28))
R_A = torch.tensor([1.0, 0.0, 0.0, 1.0])  # mean 0.5; V(10) = mean{0,1,3} = 2/3; V(20) = mean{1,3} = 1/2


def _expected_a() -> torch.Tensor:
    exp = torch.zeros(4, 32)
    exp[0, :10], exp[0, 10:30] = 1 / 6, 1 / 3
    exp[1, :10], exp[1, 10:20], exp[1, 20:25] = 1 / 6, -1 / 6, -0.5
    exp[2, :20] = -0.5
    exp[3, :10], exp[3, 10:20], exp[3, 20:28] = 1 / 6, -1 / 6, 0.5
    return exp


def test_hand_computed_segments_alpha0():
    adv = segment_advantages(TREE_A, R_A, width=32, alpha=0.0)
    assert torch.allclose(adv, _expected_a(), atol=1e-6)


def test_shared_prefix_follows_the_tree():
    assert TREE_A.shared_prefix(3, 0) == 10  # 3 shares 20 with 1, which shares 10 with 0
    assert TREE_A.shared_prefix(3, 1) == 20
    assert TREE_A.shared_prefix(2, 0) == 0
    assert TREE_A.shared_prefix(1, 1) == 25


def test_length_discount_eq8_worked_example():
    # correct chains: 0 (L 30) and 3 (L 28, the shortest); they diverge at k = 10.
    # factor = 1 - ((28 - 10) / (30 - 10)) ** 1 = 0.1 -> chain 0 tokens [10, 30): 1/3 - 1/3 * 0.1 = 0.3
    adv = segment_advantages(TREE_A, R_A, width=32, alpha=1.0)
    expected = _expected_a()
    expected[0, 10:30] = 0.3
    assert torch.allclose(adv, expected, atol=1e-6)
    # alpha = 2: factor = 1 - 0.81 = 0.19
    adv2 = segment_advantages(TREE_A, R_A, width=32, alpha=2.0)
    assert adv2[0, 15].item() == pytest.approx(1 / 3 * (1 - 0.19))


def test_length_discount_makes_negative_advantages_more_negative():
    adv = torch.full((10,), -0.5)
    out = length_discount(adv, length=10, shortest=8, diverge=0, alpha=1.0)  # factor 0.2
    assert torch.allclose(out, torch.full((10,), -0.6))
    assert torch.equal(length_discount(adv, 10, 10, 0, 1.0), adv)  # not longer: unchanged


def test_alpha0_changes_nothing_and_only_verbose_correct_chains_are_discounted():
    base = segment_advantages(TREE_A, R_A, width=32, alpha=0.0)
    disc = segment_advantages(TREE_A, R_A, width=32, alpha=1.0)
    changed = (base != disc).nonzero()
    assert set(changed[:, 0].tolist()) == {0}  # only chain 0, the longer correct one
    assert changed[:, 1].min().item() == 10  # only after the divergence point


def test_epsilon_one_is_dr_grpo():
    lengths = (7, 12, 5, 9)
    tree = ChainTree(parents=(-1, -1, -1, -1), branch_positions=(-1, 0, 0, 0), lengths=lengths)
    rewards = torch.tensor([1.0, 0.0, 1.0, 0.0])
    adv = segment_advantages(tree, rewards, width=12, alpha=0.0)
    dr = group_centered_rewards(rewards, torch.zeros(4, dtype=torch.long), normalize_std=False)
    for c, n in enumerate(lengths):
        assert torch.allclose(adv[c, :n], torch.full((n,), dr[c].item()))
        assert torch.all(adv[c, n:] == 0)


def _random_tree(rng: random.Random, g: int = 8, eps: float = 0.5) -> ChainTree:
    parents, positions, lengths = [-1], [-1], [rng.randint(5, 40)]
    for _ in range(1, g):
        if rng.random() < eps:
            parents.append(-1)
            positions.append(0)
            lengths.append(rng.randint(3, 40))
        else:
            p = rng.randrange(len(parents))
            k = rng.randrange(0, lengths[p])
            parents.append(p)
            positions.append(k)
            lengths.append(k + rng.randint(1, 30))
    return ChainTree(tuple(parents), tuple(positions), tuple(lengths))


@pytest.mark.parametrize("code_compat", [False, True])
def test_segments_telescope_to_r_minus_mean(code_compat):
    rng = random.Random(0)
    for _ in range(50):
        tree = _random_tree(rng)
        rewards = torch.tensor([float(rng.random() < 0.5) for _ in range(len(tree))])
        adv = segment_advantages(tree, rewards, width=80, alpha=0.0, code_compat=code_compat)
        for c in range(len(tree)):
            n = tree.lengths[c]
            row = adv[c, :n]
            # one value per segment, read at each segment's first token
            if code_compat:
                starts = sorted({0, *(k for k in code_compat_node_sets(tree)[c] if k < n)})
            else:
                starts = sorted({0, *exact_node_points(tree)[0][c]})
            total = sum(row[s].item() for s in starts)
            assert total == pytest.approx(rewards[c].item() - rewards.mean().item(), abs=1e-5)


def test_code_compat_agrees_without_collisions():
    a = segment_advantages(TREE_A, R_A, width=32, alpha=1.0)
    b = segment_advantages(TREE_A, R_A, width=32, alpha=1.0, code_compat=True)
    assert torch.allclose(a, b, atol=1e-6)


def test_code_compat_quirk_ancestor_position_after_divergence():
    # 1 from 0 at 100; 2 from 1 at 50. The code puts 100 into chain 2's set, so V(100) averages
    # chains {0, 1, 2} (= 2/3) although chain 2 never passes node 100; exactly, V(100) = mean{0, 1} = 1.
    tree = ChainTree(parents=(-1, 0, 1, -1), branch_positions=(-1, 100, 50, 0), lengths=(120, 110, 60, 40))
    r = torch.tensor([1.0, 1.0, 0.0, 0.0])
    exact = segment_advantages(tree, r, width=120, alpha=0.0)
    compat = segment_advantages(tree, r, width=120, alpha=0.0, code_compat=True)
    assert exact[0, 60].item() == pytest.approx(1 - 2 / 3)  # V(100) - V(50)
    assert compat[0, 60].item() == pytest.approx(0.0, abs=1e-6)
    assert torch.allclose(exact[2], compat[2])  # chain 2's own segments agree
    assert exact[2, 0].item() == pytest.approx(2 / 3 - 0.5)


def test_code_compat_merges_nodes_at_the_same_position():
    # 1 from 0 at 10 and 3 from 2 at 10: two different nodes, one key in the code.
    tree = ChainTree(parents=(-1, 0, -1, 2), branch_positions=(-1, 10, 0, 10), lengths=(30, 30, 30, 30))
    r = torch.tensor([1.0, 1.0, 0.0, 0.0])
    exact = segment_advantages(tree, r, width=30, alpha=0.0)
    compat = segment_advantages(tree, r, width=30, alpha=0.0, code_compat=True)
    assert exact[0, 0].item() == pytest.approx(0.5) and exact[0, 20].item() == pytest.approx(0.0)
    assert compat[0, 0].item() == pytest.approx(0.0) and compat[0, 20].item() == pytest.approx(0.5)


def test_invalid_trees_are_rejected():
    with pytest.raises(ValueError, match="earlier chain"):
        ChainTree(parents=(-1, 2, -1), branch_positions=(-1, 3, 0), lengths=(5, 5, 5))
    with pytest.raises(ValueError, match="outside parent"):
        ChainTree(parents=(-1, 0), branch_positions=(-1, 9), lengths=(5, 12))
    with pytest.raises(ValueError, match="shape"):
        segment_advantages(TREE_A, torch.ones(3), width=32)


def _token_tree(gen: torch.Generator, g: int) -> tuple[ChainTree, list[list[int]]]:
    """A random ROSE-like tree with the chains' token lists: fresh chains start with a token of their
    own, a branch at k copies its parent's first k tokens and re-samples token k to a token of its own,
    so two chains share exactly the tokens the tree says they share."""
    chains: list[list[int]] = []
    parents, positions = [], []
    for c in range(g):
        length = int(torch.randint(1, 12, (1,), generator=gen))
        tail = torch.randint(0, 5, (length,), generator=gen).tolist()
        if c == 0 or float(torch.rand(1, generator=gen)) < 0.3:
            chains.append([1000 + c] + tail[1:])
            parents.append(-1)
            positions.append(-1 if c == 0 else 0)
        else:
            p = int(torch.randint(0, c, (1,), generator=gen))
            k = int(torch.randint(0, len(chains[p]), (1,), generator=gen))  # 0 included: a branch at token 0
            chains.append(chains[p][:k] + [2000 + c] + tail[: length - 1])
            parents.append(p)
            positions.append(k)
    return ChainTree(tuple(parents), tuple(positions), tuple(len(x) for x in chains)), chains


def _common(a: list[int], b: list[int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def _rose_reference(
    chains: list[list[int]],
    tree: ChainTree,
    rewards: list[float],
    correct: list[bool],
    alpha: float,
    width: int,
) -> torch.Tensor:
    """ROSE paper eqs. 4-8 computed from the token lists: a node is where a branch re-sampled, its
    members the chains sharing the tokens before it; V = mean reward of the members."""
    g = len(chains)
    out = torch.zeros(g, width)
    mean = sum(rewards) / g

    def value(c: int, k: int) -> float:
        members = [m for m in range(g) if _common(chains[m], chains[c]) >= k]
        return sum(rewards[m] for m in members) / len(members)

    for c in range(g):
        points = set()
        for b in range(g):
            k = tree.branch_positions[b]
            if tree.parents[b] >= 0 and 0 < k < len(chains[c]) and _common(chains[b], chains[c]) >= k:
                points.add(k)
        cuts = sorted({0, len(chains[c]), *points})
        for a, b in zip(cuts[:-1], cuts[1:], strict=True):
            end = rewards[c] if b == len(chains[c]) else value(c, b)
            start = mean if a == 0 else value(c, a)
            out[c, a:b] = end - start
    good = [c for c in range(g) if correct[c]]
    if alpha > 0 and len(good) >= 2:
        s = min(good, key=lambda c: (len(chains[c]), c))
        for c in good:
            if c == s:
                continue
            k, length = _common(chains[s], chains[c]), len(chains[c])
            if length > k:
                factor = 1 - ((len(chains[s]) - k) / (length - k)) ** alpha
                if factor > 0:
                    out[c, k:length] = out[c, k:length] - out[c, k:length].abs() * factor
    return out


@pytest.mark.parametrize("alpha", [0.0, 1.0, 2.0])
def test_segment_advantages_equal_the_papers_definition_on_random_trees(alpha):
    gen = torch.Generator().manual_seed(int(alpha * 10))
    for _ in range(700):
        g = int(torch.randint(1, 10, (1,), generator=gen))
        tree, chains = _token_tree(gen, g)
        correct = (torch.rand(g, generator=gen) < 0.5).tolist()
        # rewards with DAPO shaping and a negative truncation reward: not 0/1, can be negative
        rewards = [
            (1.0 if ok else -0.5 * int(torch.randint(0, 2, (1,), generator=gen)))
            - 0.1 * int(torch.randint(0, 3, (1,), generator=gen))
            for ok in correct
        ]
        width = max(tree.lengths) + 3  # padding must stay 0
        got = segment_advantages(
            tree, torch.tensor(rewards), width, alpha=alpha, correct=torch.tensor(correct)
        )
        want = _rose_reference(chains, tree, rewards, correct, alpha, width)
        assert torch.allclose(got, want, atol=1e-5), (tree, rewards, correct)


def test_a_wrong_chain_with_a_non_zero_reward_is_not_the_shortest_correct_one():
    # chain 1 (wrong, shaped reward -0.2) is shortest; the correct chains 0 and 2 keep their advantages
    tree = ChainTree(parents=(-1, -1, -1), branch_positions=(-1, 0, 0), lengths=(10, 2, 10))
    rewards = torch.tensor([1.0, -0.2, 1.0])
    verified = segment_advantages(tree, rewards, 10, alpha=1.0, correct=torch.tensor([True, False, True]))
    assert torch.allclose(verified, segment_advantages(tree, rewards, 10, alpha=0.0))
    code_rule = segment_advantages(tree, rewards, 10, alpha=1.0)  # |r| > 0 counts as correct
    assert not torch.allclose(code_rule, verified)
