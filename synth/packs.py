"""Domain prompt packs: the words of every teacher prompt, per customer domain, from files.

A pack (`synth/prompts/<domain>.yaml`) holds the domain's answer types, obfuscation guidance,
few-shot examples, and the question templates of the offline generator; the shared templates
(`explore.md`, `extend.md`, `verify.md`, `distractor.md`) are filled from it. Templates use
`string.Template` (`$name`) because prompts are full of JSON braces.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from functools import lru_cache
from importlib import resources
from string import Template
from typing import Any

import yaml

DOMAINS = ("web", "finance", "legal", "email", "code")
TEMPLATES = ("explore", "extend", "verify", "distractor")
EXTRACTIVE_KINDS = ("date", "year", "number", "name")


@dataclass(frozen=True)
class PromptPack:
    domain: str
    answer_types: tuple[str, ...]
    guidance: str
    examples: tuple[dict[str, Any], ...]
    subject_token: str
    extractive_questions: dict[str, tuple[str, ...]] = field(default_factory=dict)

    def examples_text(self) -> str:
        return "\n".join(json.dumps(example, ensure_ascii=False) for example in self.examples)

    def render(self, template: str, **values: Any) -> str:
        """Fill a shared template with this pack's fields plus `values` (missing names raise)."""
        if template not in TEMPLATES:
            raise KeyError(f"unknown prompt template {template!r} (known: {', '.join(TEMPLATES)})")
        base = {"domain": self.domain, "answer_types": ", ".join(self.answer_types), "guidance": self.guidance.strip(),
                "examples": self.examples_text()}
        return Template(_template_text(template)).substitute({**base, **{k: str(v) for k, v in values.items()}})

    def extractive_question(self, kind: str, mask: str, choice: int) -> str:
        options = self.extractive_questions.get(kind) or self.extractive_questions.get("name") or ("What is $mask?",)
        return Template(options[choice % len(options)]).substitute(mask=mask)


@lru_cache(maxsize=None)
def _template_text(name: str) -> str:
    return resources.files("synth.prompts").joinpath(f"{name}.md").read_text(encoding="utf-8")


@lru_cache(maxsize=None)
def load_pack(domain: str) -> PromptPack:
    """The pack for `domain`; an unknown domain is an error naming the known ones."""
    if domain not in DOMAINS:
        raise KeyError(f"no prompt pack for domain {domain!r} (known: {', '.join(DOMAINS)})")
    data = yaml.safe_load(resources.files("synth.prompts").joinpath(f"{domain}.yaml").read_text(encoding="utf-8"))
    questions = {kind: tuple(data.get("extractive_questions", {}).get(kind, ())) for kind in EXTRACTIVE_KINDS}
    return PromptPack(
        domain=data["domain"],
        answer_types=tuple(data["answer_types"]),
        guidance=data.get("guidance", ""),
        examples=tuple(data.get("examples", [])),
        subject_token=data.get("subject_token", "[the subject]"),
        extractive_questions=questions,
    )


def pack_fingerprint(domain: str) -> str:
    """Changes whenever the domain pack or a shared template is edited (so resumed seeds are
    regenerated with the new prompts instead of reused)."""
    import hashlib

    digest = hashlib.sha256()
    folder = resources.files("synth.prompts")
    for name in [f"{domain}.yaml"] + [f"{template}.md" for template in TEMPLATES]:
        digest.update(folder.joinpath(name).read_bytes())
    return digest.hexdigest()[:16]
