"""The plan of where a step's old log-probs and sampling entropies come from, checked against what
the update needs on random batches (docs/algorithms.md, "Old log-probs"). That the first forward's
log-probs equal a separate pass bit for bit is tests/runtime/test_training.py's."""

import itertools

import numpy as np
import torch

from semrl.update.old_logprobs import FirstForward, plan_old_logprobs


def _as_set(rows: torch.Tensor | None, num_rows: int) -> set[int]:
    if rows is None:
        return set()
    if rows.dtype == torch.bool:
        assert rows.shape == (num_rows,)
        return set(torch.nonzero(rows).flatten().tolist())
    return set(rows.tolist())


def test_every_row_gets_its_old_log_probs_and_entropies_from_exactly_one_forward_at_the_sampling_weights():
    rng = np.random.default_rng(0)
    flags = list(itertools.product((False, True), repeat=4))
    for _ in range(50):
        for on_policy, has_entropy, before_update, reuse in flags:
            n = int(rng.integers(1, 20))
            everyone = set(range(n))
            # on-policy: one mini-batch of every row; otherwise a shuffled first mini-batch
            size = n if on_policy else int(rng.integers(1, n + 1))
            first_rows = torch.from_numpy(rng.permutation(n)[:size]) if reuse else None
            plan = plan_old_logprobs(
                n,
                first_rows,
                on_policy=on_policy,
                has_sampling_entropy=has_entropy,
                entropy_before_update=before_update,
            )
            by_pass = _as_set(plan.pass_rows, n)
            by_first = _as_set(plan.first_forward_rows, n)
            first_set = everyone if first_rows is None and on_policy else _as_set(first_rows, n)
            assert not by_pass & by_first
            assert by_first <= first_set  # no optimizer step precedes these forwards
            # old log-probs: off-policy each row from one source; on-policy the ratio is 1
            assert plan.old_logp_from_pass == (not on_policy)
            if not on_policy:
                assert by_pass | by_first == everyone
            # entropies: the engine's, else each row's from the pass or the first forward
            if has_entropy:
                assert not plan.pass_entropy
            else:
                assert (by_pass if plan.pass_entropy else set()) | by_first == everyone
            if not has_entropy and before_update:  # read before any forward of the update
                assert plan.pass_entropy and by_pass == everyone and not by_first
            # no forward twice, and no pass where none is needed
            if on_policy and (has_entropy or not before_update):
                assert plan.pass_rows is None
            elif not on_policy and reuse and not (not has_entropy and before_update):
                assert by_first == first_set and by_pass == everyone - first_set
            if not reuse and not on_policy:
                assert plan.first_forward_rows is None


def test_the_first_forward_takes_each_planned_row_once_and_keeps_the_pass_for_the_others():
    rng = np.random.default_rng(1)
    for _ in range(100):
        n, t = int(rng.integers(2, 9)), int(rng.integers(1, 6))
        rows = torch.from_numpy(rng.uniform(size=n) < 0.5)
        pass_logp, pass_entropy = torch.randn(n, t), torch.rand(n, t)
        mask = torch.from_numpy(rng.uniform(size=(n, t)) < 0.8).float()
        first = FirstForward(rows, pass_logp, pass_entropy, mask)
        order = torch.from_numpy(rng.permutation(n))
        given = torch.full((n, t), -1.0)
        for chunk in torch.split(order, int(rng.integers(1, n + 1))):
            logp, entropy = torch.randn(len(chunk), t), torch.rand(len(chunk), t)
            given[chunk] = entropy
            old = first.old_log_probs(chunk, logp, entropy)
            expect = torch.where(rows[chunk][:, None], logp, pass_logp[chunk])
            assert torch.equal(old, expect)
            repeat = first.old_log_probs(chunk, torch.randn(len(chunk), t), None)  # a later epoch
            assert torch.equal(repeat, expect)
        assert first.rows is not None and not first.rows.any()
        assert torch.equal(pass_logp[~rows], first.old_logp[~rows])  # the pass's rows untouched
        assert torch.equal(first.entropy[~rows], (pass_entropy * mask)[~rows])
        assert torch.equal(first.entropy[rows], given[rows])
