"""The CISPO loss, advantages and curriculum on hand-computed cases (pure tensors, no model)."""

from __future__ import annotations

import math

import pytest
import torch

from evaluation.metrics import Gold
from evaluation.tasks import Task
from training.cispo_loss import cispo_token_loss, group_advantages, merge_stats
from training.curriculum import Curriculum, hop_weights, hops_of


def _leaf(values):
    return torch.tensor(values, dtype=torch.float64, requires_grad=True)


def test_ratio_one_is_token_normalized_reinforce():
    logp = _leaf([[-1.0, -2.0, -0.5], [-0.3, -4.0, 0.0]])
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]], dtype=torch.float64)
    adv = torch.tensor([2.0, -1.0], dtype=torch.float64)
    loss, stats = cispo_token_loss(logp, logp.detach(), adv, mask, eps_low=1.0, eps_high=0.2)
    # -(1/5) * (2*(-1 - 2 - 0.5) + (-1)*(-0.3 - 4.0)) = -(1/5) * (-7 + 4.3)
    assert loss.item() == pytest.approx(-(-7.0 + 4.3) / 5)
    loss.backward()
    expected = -torch.tensor([[2.0, 2.0, 2.0], [-1.0, -1.0, 0.0]], dtype=torch.float64) / 5
    assert torch.allclose(logp.grad, expected)
    assert stats.n_tokens == 5 and stats.clip_ratio == 0.0 and stats.ratio_mean == pytest.approx(1.0)
    assert stats.entropy_proxy == pytest.approx((1 + 2 + 0.5 + 0.3 + 4.0) / 5)


def test_clipped_tokens_still_carry_gradient_through_log_pi():
    # ratio 10 on the first token (clipped to 1 + eps_high = 1.2), 0.1 on the second (clipped to 1 - 0.5).
    logp_old = torch.tensor([[-3.0, -1.0]], dtype=torch.float64)
    logp = _leaf([[-3.0 + math.log(10.0), -1.0 + math.log(0.1)]])
    adv = torch.tensor([1.5], dtype=torch.float64)
    loss, stats = cispo_token_loss(logp, logp_old, adv, torch.ones(1, 2, dtype=torch.float64), eps_low=0.5, eps_high=0.2)
    loss.backward()
    # d loss / d logp_t = -sg(clip(r_t)) * A / N: nonzero although both weights are clipped
    assert torch.allclose(logp.grad, torch.tensor([[-1.2 * 1.5 / 2, -0.5 * 1.5 / 2]], dtype=torch.float64))
    assert stats.clip_ratio == 1.0 and stats.clip_high == 0.5 and stats.clip_low == 0.5


def test_eps_low_at_least_one_means_no_lower_bound():
    logp_old = torch.tensor([[0.0]], dtype=torch.float64)
    logp = _leaf([[math.log(0.01)]])
    loss, stats = cispo_token_loss(logp, logp_old, torch.tensor([1.0], dtype=torch.float64), torch.ones(1, 1), eps_low=1.0, eps_high=0.2)
    loss.backward()
    assert logp.grad.item() == pytest.approx(-0.01) and stats.clip_ratio == 0.0


def test_normalization_by_the_global_token_count():
    logp = _leaf([[-1.0, -2.0]])
    mask = torch.ones(1, 2, dtype=torch.float64)
    adv = torch.tensor([1.0], dtype=torch.float64)
    local, _ = cispo_token_loss(logp, logp.detach(), adv, mask, 1.0, 0.2)
    global_, stats = cispo_token_loss(logp, logp.detach(), adv, mask, 1.0, 0.2, n_tokens=8)
    assert global_.item() == pytest.approx(local.item() * 2 / 8)
    assert stats.n_tokens == 2 and stats.n_tokens_global == 8


def test_split_batch_losses_add_up_to_the_full_batch():
    torch.manual_seed(0)
    logp_full = torch.randn(4, 6, dtype=torch.float64)
    old = logp_full + 0.3 * torch.randn(4, 6, dtype=torch.float64)
    mask = (torch.rand(4, 6) > 0.3).double()
    adv = torch.randn(4, dtype=torch.float64)
    a = logp_full.clone().requires_grad_(True)
    full, _ = cispo_token_loss(a, old, adv, mask, 1.0, 0.3)
    full.backward()
    b = logp_full.clone().requires_grad_(True)
    n = mask.sum()
    parts = [cispo_token_loss(b[i:i + 2], old[i:i + 2], adv[i:i + 2], mask[i:i + 2], 1.0, 0.3, n_tokens=n) for i in (0, 2)]
    sum(p[0] for p in parts).backward()
    assert torch.allclose(a.grad, b.grad)
    assert merge_stats([p[1] for p in parts])["loss"] == pytest.approx(full.item())


def test_padding_holding_nan_contributes_nothing():
    logp = _leaf([[-1.0, float("nan")]])
    old = torch.tensor([[-1.0, float("inf")]], dtype=torch.float64)
    loss, _ = cispo_token_loss(logp, old, torch.tensor([1.0], dtype=torch.float64), torch.tensor([[1.0, 0.0]]), 1.0, 0.2)
    loss.backward()
    assert torch.isfinite(loss) and torch.isfinite(logp.grad).all()


def test_matches_trl_cispo_per_token_loss_when_no_lower_bound():
    """TRL 1.16 `_compute_loss` (loss_type="cispo"): -clamp(r, max=epsilon_high).detach() * A * logp,
    summed over the mask and divided by the batch's completion tokens; epsilon_high there is the
    ratio cap, i.e. 1 + our eps_high."""
    torch.manual_seed(1)
    logp = torch.randn(3, 5, dtype=torch.float64) - 2
    old = logp.detach() + torch.randn(3, 5, dtype=torch.float64)
    mask = (torch.rand(3, 5) > 0.2).double()
    adv = torch.randn(3, dtype=torch.float64)
    ours, _ = cispo_token_loss(logp, old, adv, mask, eps_low=1.0, eps_high=4.0)
    coef = torch.exp(logp - old)
    trl = ((-torch.clamp(coef, max=5.0).detach() * adv.unsqueeze(1) * logp) * mask).sum() / mask.sum()
    assert ours.item() == pytest.approx(trl.item())


def test_group_advantages_normalize_and_drop_equal_groups():
    advantages = group_advantages([0.0, 2.0])
    assert advantages == pytest.approx([-1.0, 1.0], abs=1e-5)
    assert sum(group_advantages([0.1, 0.5, 0.9, 2.0])) == pytest.approx(0.0, abs=1e-9)
    assert group_advantages([0.7] * 8) is None
    assert group_advantages([]) is None
    with pytest.raises(ValueError):
        group_advantages([1.0, float("nan")])


def test_curriculum_moves_from_low_hop_to_many_hop_tasks():
    gold = Gold(doc_ids=frozenset({"d"}))
    tasks = [Task(f"t{h}-{i}", "q", gold, hops=h) for h in (1, 2, 3) for i in range(6)]
    curriculum = Curriculum(tasks, tasks_per_step=6, total_steps=40, seed=3)

    def mean_hops(steps):
        drawn = [t.hops for s in steps for t in curriculum.tasks_for_step(s)]
        return sum(drawn) / len(drawn)

    early, late = mean_hops(range(0, 8)), mean_hops(range(32, 40))
    assert early < 1.8 and late > 2.2, (early, late)
    assert [t.task_id for t in curriculum.tasks_for_step(5)] == [t.task_id for t in curriculum.tasks_for_step(5)]
    assert len({t.task_id for t in curriculum.tasks_for_step(0)}) == 6  # distinct within a step
    weights = hop_weights([1, 2, 3], 0.0)
    assert weights[1] > weights[2] > weights[3] > 0
    assert hop_weights([1, 2, 3], 1.0)[3] > hop_weights([1, 2, 3], 1.0)[1]
    assert curriculum.epoch(0) == 0 and curriculum.epoch(3) == 1


def test_synthetic_tasks_keep_their_hops_as_integers_and_files_have_none():
    from evaluation.external import ExternalRecord, tasks_from_records
    from evaluation.synth_tasks import tasks_from_synth
    from synth.schema import SupportingItem, SynthTask

    items = [SupportingItem(id=doc, contains_truth=doc == "b") for doc in ("a", "b")]
    synthetic = SynthTask(level=1, question="Which?", truth="x", supporting_items=items, passed_verification=True).with_id()
    [task] = tasks_from_synth([synthetic])
    assert task.hops == synthetic.hops == 2 and task.group == "2-hop" and hops_of(task) == 2
    record = ExternalRecord("r1", "Who?", "Ann", ({"title": "A", "text": "Ann wrote it.", "is_supporting": True},), "hotpotqa")
    [external] = tasks_from_records([record])
    assert external.hops is None and hops_of(external) == 1  # an external file's task: one curriculum level
