"""Per-seed records in the artifact store: what makes a crashed or repeated run resume.

After a seed's chain of tasks is generated and verified, its tasks are written under
`{prefix}/seeds/{fingerprint}/{seed_doc_id}.json` with the content hash of every document
they rely on. A rerun with the same configuration (the fingerprint covers the generator
settings, the teacher model and the prompt files) reuses a record unless one of those
documents changed or disappeared, in which case the seed is regenerated (its unchanged
teacher calls still come from the LLM cache).
"""

from __future__ import annotations

import json

from core.storage import ArtifactNotFound, ArtifactStore
from synth.corpus_view import CorpusView
from synth.schema import SynthTask

RECORD_FORMAT = "1"


def _doc_ids(seed_doc_id: str, tasks: list[SynthTask]) -> list[str]:
    ids = {seed_doc_id}
    for task in tasks:
        ids.update(task.supporting_ids)
        if task.bridging_item is not None:
            ids.add(task.bridging_item.id)
    return sorted(ids)


class SeedRecords:
    def __init__(self, store: ArtifactStore, prefix: str, fingerprint: str):
        self.store = store
        self.prefix = prefix.strip("/")
        self.fingerprint = fingerprint

    def key(self, seed_doc_id: str) -> str:
        return f"{self.prefix}/seeds/{self.fingerprint}/{seed_doc_id}.json"

    def load(self, seed_doc_id: str, corpus: CorpusView) -> list[SynthTask] | None:
        """The seed's tasks, or None when there is no record or a document it used changed."""
        try:
            data = json.loads(self.store.read_bytes(self.key(seed_doc_id)))
        except (ArtifactNotFound, ValueError):
            return None
        if data.get("format") != RECORD_FORMAT:
            return None
        for doc_id, digest in data.get("doc_hashes", {}).items():
            if corpus.content_hash(doc_id) != digest:  # also: a missing document that now exists
                return None
        return [SynthTask.model_validate(task) for task in data.get("tasks", [])]

    def save(self, seed_doc_id: str, tasks: list[SynthTask], corpus: CorpusView) -> None:
        hashes = {doc_id: corpus.content_hash(doc_id) for doc_id in _doc_ids(seed_doc_id, tasks)}
        body = {"format": RECORD_FORMAT, "seed": seed_doc_id, "doc_hashes": hashes,
                "tasks": [task.model_dump(mode="json") for task in tasks]}
        self.store.write_bytes(self.key(seed_doc_id), json.dumps(body, ensure_ascii=False).encode("utf-8"))
