"""When a corpus resync changed enough of a customer's corpus to retrain its search agent.

Why a share and not any change: a nightly resync of a live wiki always changes a few pages, and
retraining (tasks, distillation, RL, benchmark) costs hours of accelerator time; the customer
file's `limits.resync_retrain_share` says how much churn is worth it. The share is measured
against the corpus before the sync (added + changed + deleted over the documents that existed),
so a first sync of an empty corpus counts as a full change.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping


@dataclass(frozen=True)
class RetrainDecision:
    retrain: bool
    changed_share: float
    reason: str


def _count(metadata: Mapping[str, Any], key: str) -> int:
    value = metadata.get(key, 0)
    value = getattr(value, "value", value)  # Dagster metadata values or plain numbers
    return int(value or 0)


def retrain_decision(sync_metadata: Mapping[str, Any], threshold: float) -> RetrainDecision:
    """Decide from a `raw_documents` materialization's counts (added, changed, deleted, documents)."""
    added, changed, deleted = (_count(sync_metadata, k) for k in ("added", "changed", "deleted"))
    documents_after = _count(sync_metadata, "documents")
    before = documents_after - added + deleted
    touched = added + changed + deleted
    share = 1.0 if before <= 0 and touched else (touched / before if before > 0 else 0.0)
    numbers = f"{touched} of {max(before, 0)} documents changed ({share:.1%}; added {added}, changed {changed}, deleted {deleted})"
    if touched == 0:
        return RetrainDecision(False, 0.0, "nothing changed")
    if share > threshold:
        return RetrainDecision(True, share, f"{numbers}, above the {threshold:.0%} retrain share")
    return RetrainDecision(False, share, f"{numbers}, within the {threshold:.0%} retrain share")
