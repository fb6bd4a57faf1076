"""Policy specs, parsed in one place.

A spec is how a person, a customer file, a report or the served record names a policy:
`POLICY[@N][+rerank]`, where POLICY is a single-shot baseline (`bm25`, `dense`, `hybrid`), the
scripted `heuristic`, `openai:URL#MODEL` or `transformers:PATH` (a model folder, `smollm2`, a
LoRA adapter folder whose base is in its sidecar, or `BASE+ADAPTER`); `@N` runs N rollouts merged
by RRF and `+rerank` rebuilds the final ranking by selection with a reranker. Strings are the
format at the edges: the CLI, the customer file, report keys and records on disk. Between stages
a spec travels as a `PolicySpec` (training's checkpoints to the benchmark's candidates, the served
record to the search service and the teacher), parsed once where it enters; code that needs to
know what a spec means asks it (and its `AdapterRef`), so the grammar, including the two meanings
of `+`, lives here only. Functions that also serve the edges take either form (`PolicySpec.of`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

BASELINES = ("bm25", "dense", "hybrid")
RERANK_SUFFIX = "+rerank"
_NX = re.compile(r"^(?P<spec>.+)@(?P<n>\d+)$")


@dataclass(frozen=True)
class AdapterRef:
    """A LoRA adapter folder named by a spec, and the base model when the spec names it."""

    folder: str
    named_base: str | None = None

    @property
    def readable(self) -> bool:
        """The folder is an adapter on this machine (it may live on another worker)."""
        return (Path(self.folder).expanduser() / "adapter_config.json").is_file()

    def sidecar(self) -> dict[str, Any]:
        """What our trainers wrote beside the adapter (base model, harness profile, metrics)."""
        from agent.adapter_sidecar import read_sidecar

        return read_sidecar(self.folder)

    @property
    def base_model(self) -> str | None:
        """The named base, else the one the adapter records (None where it cannot be read)."""
        if self.named_base:
            return self.named_base
        if not self.readable:
            return None
        from agent.policies.transformers_policy import adapter_base_model

        return adapter_base_model(Path(self.folder).expanduser())


@dataclass(frozen=True)
class PolicySpec:
    name: str  # as written, the report's key
    policy: str  # without the @N and +rerank suffixes
    n: int = 1
    rerank: bool = False  # selection by the reranker over what the policy surfaced

    @classmethod
    def of(cls, value: str | PolicySpec) -> PolicySpec:
        """`value` as a spec: parsed when it is the string form (a CLI argument, a customer file's
        list, a report key), as is when a stage already handed over the object."""
        return value if isinstance(value, PolicySpec) else cls.parse(value)

    @classmethod
    def for_adapter(cls, folder: str | Path) -> PolicySpec:
        """The spec of a LoRA adapter folder (a training checkpoint): `transformers:FOLDER`."""
        return cls.parse(f"transformers:{folder}")

    @classmethod
    def parse(cls, text: str) -> PolicySpec:
        """`hybrid` -> baseline; `heuristic@4` -> heuristic, N=4; `openai:http://h/v1#m@2` -> N=2;
        `hybrid+rerank`, `heuristic@4+rerank` -> the same with selection by the reranker."""
        name = text = text.strip()
        if not text:
            raise ValueError("empty policy spec")
        rerank = text.endswith(RERANK_SUFFIX)
        text = text.removesuffix(RERANK_SUFFIX)
        match = _NX.match(text)
        policy, n = (match.group("spec"), int(match.group("n"))) if match else (text, 1)
        if n < 1:
            raise ValueError(f"{text}: N in POLICY@N must be >= 1")
        if policy in BASELINES and n != 1:
            raise ValueError(f"{text}: single-shot baselines have no Nx variant")
        return cls(name=name, policy=policy, n=n, rerank=rerank)

    @property
    def is_baseline(self) -> bool:
        return self.policy in BASELINES

    @property
    def generates_in_process(self) -> bool:
        """A local model (`transformers:...`) whose turns this process generates, batched."""
        return self.policy.partition(":")[0] == "transformers"

    def without_selection(self) -> PolicySpec:
        return PolicySpec(self.name.removesuffix(RERANK_SUFFIX) if self.rerank else self.name, self.policy, self.n)

    def adapter(self) -> AdapterRef | None:
        """The LoRA adapter the policy runs, or None (no weights of ours, or a full model folder).

        `transformers:BASE+ADAPTER` names both; `transformers:PATH` is a full model when PATH holds
        a `config.json` (or is `smollm2`), else an adapter folder, possibly on another machine."""
        prefix, _, rest = self.policy.partition(":")
        if prefix != "transformers" or not rest:
            return None
        base, plus, adapter = rest.partition("+")
        if plus:
            return AdapterRef(adapter, base)
        from agent.policies.transformers_policy import SMOLLM2_ALIASES

        if (Path(rest).expanduser() / "config.json").is_file() or rest.lower() in SMOLLM2_ALIASES:
            return None
        return AdapterRef(rest)
