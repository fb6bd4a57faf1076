"""How much selection trusts the policy's order against the reranker's, chosen per customer and
per kind of candidate.

Why: selection fuses the policy's ranking with the reranker's by reciprocal rank, equal
weights by default. A reranker fine-tuned for a few minutes on synthetic tasks can be worse than
the heuristic's own order on real questions (measured on the multi-hop dev file: heuristic 0.801
answer found, heuristic+rerank 0.594 at weight 1), and a served `+rerank` must not lose what the
policy already had. So when a reranker is trained, each kind of candidate selection serves runs on
the customer's dev split (verified tasks training never saw) and each weight of a small grid, with
the reranker judging by the question alone or by two-document chains
(`search.reranker.Reranker.chain_order`), is scored by recall of the gold documents in the top k;
the best is kept beside the weights (`search.reranker.SELECTION_FILE`), ties going to the question
alone and the larger weight (the policy's own order). At `POLICY_ORDER` the reranker changes
nothing: selection is the policy's ranking followed by the other surfaced documents, which is
where a reranker that does not help on the customer's own tasks is left.

Why per kind (`agent.selection.CALIBRATED_POLICIES`): an agent's order already holds what its
later hops found, a single-shot list's order is one search's, so the same reranker deserves more
say over the second. Measured on the multi-hop dev file with one customer's reranker (`bench/
selection_sweep.py`): the weight the heuristic's calibration chose (2) gave `hybrid+rerank` 0.689,
the weight hybrid's own calibration on the synthetic dev split chose (1) gave 0.711, ahead on both
halves of the file.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from agent.selection import AGENT_POLICY, CALIBRATED_POLICIES, SINGLE_SHOT_POLICY, SelectionSettings, fuse, policy_order, surfaced_texts
from agent.trajectory import Trajectory
from search.backend import SearchBackend
from search.reranker import Reranker

# With rrf_k 10 the reranker's term is at most 1/11; at weight 1000 adjacent policy ranks (up to 40)
# differ by more than that, so the order is the policy's.
POLICY_ORDER = 1000.0
WEIGHTS = (0.25, 0.5, 1.0, 2.0, 4.0, POLICY_ORDER)
# How the reranker judges: by the question alone (0), or by two-document chains from the 3 best
# first links (`Reranker.chain_order`).
CHAIN_CHOICES = (0, 3)


def calibrate(tasks: Sequence[Any], backend: SearchBackend, reranker: Reranker, k: int,
              policies: Sequence[str] = CALIBRATED_POLICIES, weights: Sequence[float] = WEIGHTS,
              chain_choices: Sequence[int] = CHAIN_CHOICES) -> dict[str, Any]:
    """Each of `policies` calibrated on `tasks` (`calibrate_policy`), under `by_policy`; the agent's
    choice is also the file's top level, which rerankers calibrated before per-kind choices read."""
    by_policy = {policy: calibrate_policy(tasks, backend, reranker, k, policy, weights, chain_choices) for policy in policies}
    top = by_policy.get(AGENT_POLICY) or next(iter(by_policy.values()))
    return {**top, "by_policy": by_policy}


def calibrate_policy(tasks: Sequence[Any], backend: SearchBackend, reranker: Reranker, k: int, policy: str = AGENT_POLICY,
                     weights: Sequence[float] = WEIGHTS, chain_choices: Sequence[int] = CHAIN_CHOICES) -> dict[str, Any]:
    """Run `policy` on `tasks` (bench tasks with gold doc ids) once; score selection for each way of
    judging and each weight. Ties go to judging by the question, then to the larger weight."""
    settings = SelectionSettings()
    recalls: dict[tuple[int, float], list[float]] = {(c, w): [] for c in chain_choices for w in weights}
    with _runner(policy, backend, k) as run:
        for task in tasks:
            trajectory = run(task.question, task.task_id)
            gold = task.gold.doc_ids
            if not gold:
                continue
            order = policy_order(trajectory)[: settings.max_candidates]
            candidates = surfaced_texts(trajectory, backend, order)
            judged_by = reranker.orders(task.question, candidates, chain_choices)  # each pair scored once
            for chain in chain_choices:
                judged = [doc for doc, _ in judged_by[chain]]
                for weight in weights:
                    top = fuse(order, judged, SelectionSettings(rrf_k=settings.rrf_k, policy_weight=weight))[:k]
                    recalls[(chain, weight)].append(len(gold & set(top)) / len(gold))
    n = len(next(iter(recalls.values()), []))
    by_choice = {choice: round(sum(values) / n, 4) if n else 0.0 for choice, values in recalls.items()}
    chain, best = max(by_choice, key=lambda choice: (by_choice[choice], -choice[0], choice[1]))
    return {
        "policy_weight": best, "chain_anchors": chain,
        "recall_at_k_by_weight": {str(w): by_choice[(chain, w)] for w in weights},
        "recall_at_k_by_choice": {f"chain{c}/{w:g}": r for (c, w), r in by_choice.items()},
        "tasks": n, "policy": policy, "k": k,
    }


@contextmanager
def _runner(policy: str, backend: SearchBackend, k: int) -> Iterator[Callable[[str, str], Trajectory]]:
    """`policy`'s episodes as selection sees them: the heuristic agent listing `k` documents, or
    the single-shot hybrid list handing its top `RERANK_BASELINE_DOCS` over, as `hybrid+rerank` does."""
    if policy == SINGLE_SHOT_POLICY:
        from evaluation.baselines import SingleShotBaseline
        from evaluation.candidates import RERANK_BASELINE_DOCS

        baseline = SingleShotBaseline(backend, policy, max(k, RERANK_BASELINE_DOCS))
        yield lambda question, task_id: baseline.run(question, task_id=task_id)
        return
    from agent.environment import open_harness
    from agent.policies import load_policy

    with open_harness(load_policy(policy, max_docs=k), backend, max_output_docs=k) as harness:
        yield lambda question, task_id: harness.run(question, task_id=task_id)
