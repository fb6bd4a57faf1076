"""What a customer is served now, what it was served before, and how to go back.

One JSON object per customer in the artifact store, `{customer}/serving/served.json`:

    {"customer": "acme", "current": ServedRecord | null, "history": [ServedRecord, ...], "log": [ServedEvent, ...]}

`history` is a stack of the records that were served before `current` (oldest first), so a
rollback is a pop; `log` is the append-only audit trail of every promotion and rollback (what,
when, why), which a rollback never rewrites. Why the artifact store and not Dagster's own
materialization history: the search service and `searchsmith serve --rollback` read it without
Dagster, and on S3 it is shared by every machine that serves.

Simplified: the update is read-modify-write without a lock. A single PUT (or a local atomic
rename) never leaves a torn file, but two promotions racing for the same customer could lose
one; the lineage runs one `served_model` materialization per customer at a time.
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from core.adapter_record import AdapterRecord, lift_flat_fields
from core.layout import served_key
from core.storage import ArtifactStore

NOTHING_SERVED_POLICY = "heuristic"  # what the search service runs when no model is served


def utc_now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


class ServedRecord(BaseModel):
    """One promoted policy: enough to serve it again on any machine and to judge the next candidate."""

    model_config = ConfigDict(extra="forbid")

    customer: str
    policy: str  # the candidate spec as benchmarked: `heuristic`, `transformers:/path/to/adapter`
    adapter: AdapterRecord | None = None  # None for policies without weights of ours (heuristic, a full model)
    metrics: dict[str, dict[str, float]] = Field(default_factory=dict)  # suite -> metric -> value
    promoted_at: str = Field(default_factory=utc_now)  # UTC ISO 8601
    reason: str = ""  # the gate's decision, in words

    _lift_flat_fields = model_validator(mode="before")(lift_flat_fields)


class ServedEvent(BaseModel):
    model_config = ConfigDict(extra="forbid")

    action: Literal["promote", "rollback"]
    policy: str | None  # what is served after the event (None: nothing, the heuristic fallback)
    previous: str | None  # what was served before it
    at: str = Field(default_factory=utc_now)
    reason: str = ""


class ServedState(BaseModel):
    model_config = ConfigDict(extra="forbid")

    customer: str
    current: ServedRecord | None = None
    history: list[ServedRecord] = Field(default_factory=list)
    log: list[ServedEvent] = Field(default_factory=list)


class NothingToRollBack(RuntimeError):
    """`rollback` with nothing served: there is no state to leave."""


def load_state(store: ArtifactStore, customer: str) -> ServedState:
    key = served_key(customer)
    if not store.exists(key):
        return ServedState(customer=customer)
    state = store.read_record(key, ServedState.model_validate)
    if state.customer != customer:
        raise ValueError(f"{store.uri(key)} belongs to customer {state.customer!r}, not {customer!r}")
    return state


def _save_state(store: ArtifactStore, state: ServedState) -> None:
    store.write_text(served_key(state.customer), state.model_dump_json(indent=2) + "\n")


def load_served(store: ArtifactStore, customer: str) -> ServedRecord | None:
    """The record served now, or None when nothing has been promoted (or everything rolled back)."""
    return load_state(store, customer).current


def promote(store: ArtifactStore, customer: str, record: ServedRecord) -> ServedState:
    """Make `record` the served one; the one it replaces goes on the history stack."""
    if record.customer != customer:
        raise ValueError(f"record for customer {record.customer!r} cannot be promoted for {customer!r}")
    state = load_state(store, customer)
    previous = state.current
    if previous is not None:
        state.history.append(previous)
    state.current = record
    state.log.append(ServedEvent(action="promote", policy=record.policy, previous=previous.policy if previous else None,
                                 reason=record.reason))
    _save_state(store, state)
    return state


def rollback(store: ArtifactStore, customer: str, reason: str = "manual rollback") -> ServedRecord | None:
    """Restore the record served before the current one and return it.

    Rolling back the first promotion returns None: the customer is back to nothing served, i.e.
    the heuristic policy, which is what was answering before. Raises `NothingToRollBack` when
    nothing is served at all. The rolled-back record is not kept on the stack (promote it again
    to return to it); the log keeps that it was served.
    """
    state = load_state(store, customer)
    if state.current is None:
        raise NothingToRollBack(
            f"nothing to roll back for customer {customer!r}: no model is served "
            f"(the search service already uses the {NOTHING_SERVED_POLICY} policy)"
        )
    leaving = state.current
    state.current = state.history.pop() if state.history else None
    state.log.append(ServedEvent(action="rollback", policy=state.current.policy if state.current else None,
                                 previous=leaving.policy, reason=reason))
    _save_state(store, state)
    return state.current


def served_policy_spec(store: ArtifactStore, customer: str) -> str:
    """The policy spec the search service should run for `customer` (`heuristic` when nothing is served)."""
    record = load_served(store, customer)
    return record.policy if record is not None else NOTHING_SERVED_POLICY
