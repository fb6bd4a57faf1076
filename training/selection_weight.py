"""How much selection trusts the policy's order against the reranker's, chosen per customer.

Why: selection fuses the policy's ranking with the reranker's by reciprocal rank, equal
weights by default. A reranker fine-tuned for a few minutes on synthetic tasks can be worse than
the heuristic's own order on real questions (measured on the multi-hop dev file: heuristic 0.801
answer found, heuristic+rerank 0.594 at weight 1), and a served `+rerank` must not lose what the
policy already had. So when a reranker is trained, the heuristic runs on the customer's dev split
(verified tasks training never saw) and each weight of a small grid is scored by recall of the
gold documents in the top k; the best one is kept beside the weights (`search.reranker.SELECTION_FILE`), ties
going to the larger weight (the policy's own order). At `POLICY_ORDER` the reranker changes
nothing: selection is the policy's ranking followed by the other surfaced documents, which is
where a reranker that does not help on the customer's own tasks is left.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from agent.selection import SelectionSettings, fuse, policy_order, surfaced_texts
from search.backend import SearchBackend
from search.reranker import Reranker

# With rrf_k 10 the reranker's term is at most 1/11; at weight 1000 adjacent policy ranks (up to 40)
# differ by more than that, so the order is the policy's.
POLICY_ORDER = 1000.0
WEIGHTS = (0.25, 0.5, 1.0, 2.0, 4.0, POLICY_ORDER)


def calibrate(tasks: Sequence[Any], backend: SearchBackend, reranker: Reranker, k: int, policy: str = "heuristic",
              weights: Sequence[float] = WEIGHTS) -> dict[str, Any]:
    """Run `policy` on `tasks` (bench tasks with gold doc ids) once, score selection at each weight."""
    from agent.environment import open_harness
    from agent.policies import load_policy

    settings = SelectionSettings()
    recalls: dict[float, list[float]] = {w: [] for w in weights}
    with open_harness(load_policy(policy, max_docs=k), backend, max_output_docs=k) as harness:
        for task in tasks:
            trajectory = harness.run(task.question, task_id=task.task_id)
            gold = task.gold.doc_ids
            if not gold:
                continue
            order = policy_order(trajectory)[: settings.max_candidates]
            judged = [doc for doc, _ in reranker.order(task.question, surfaced_texts(trajectory, backend, order))]
            for weight in weights:
                top = fuse(order, judged, SelectionSettings(rrf_k=settings.rrf_k, policy_weight=weight))[:k]
                recalls[weight].append(len(gold & set(top)) / len(gold))
    n = len(next(iter(recalls.values()), []))
    by_weight = {weight: round(sum(values) / n, 4) if n else 0.0 for weight, values in recalls.items()}
    best = max(weights, key=lambda w: (by_weight[w], w))
    return {"policy_weight": best, "recall_at_k_by_weight": {str(w): r for w, r in by_weight.items()}, "tasks": n, "policy": policy, "k": k}
