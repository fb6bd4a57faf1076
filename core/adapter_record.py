"""One record of a trained LoRA adapter, as every stage names it.

Why one record: training wrote `adapter_path`/`adapter_key`/`base_model` into its checkpoint
manifest, the promotion gate wrote `adapter_path`/`base_model` into the served record (without
the store key), and the serving manifest copied them again. The machine that serves a promoted
adapter is rarely the one that trained it (a Kubernetes search-service pod, a vLLM host), and
without the key nothing but the trainer's disk knew where the weights were. One record carries
the folder, the artifact-store prefix it was published under and the base model, so whoever
holds a record can bring the weights onto its own disk (`local_folder`).

Records written before this one existed are flat (`adapter_path`, `adapter_key`, `base_model`
beside the other fields); `lift_flat_fields` reads them, nothing writes them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict

from core.storage import ArtifactStore, pull_folder


def adapter_complete(folder: Path) -> bool:
    """A peft adapter is usable once both its config and its weights are on disk."""
    return (folder / "adapter_config.json").is_file() and any(folder.glob("adapter_model.*"))


class AdapterRecord(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    path: str  # the folder on the machine that trained it (pulled there on another machine)
    store_key: str | None = None  # the artifact-store prefix it was published under (ends with /)
    base_model: str | None = None  # as the customer spells it (`smollm2`) or a model folder

    def local_folder(self, store: ArtifactStore | None = None) -> Path:
        """The adapter's folder on this machine, pulled from the artifact store when it is not here.

        Pulled into `path` itself, so the policy spec (`transformers:PATH`) every report and the
        served record name stays valid on every machine that shares the storage layout."""
        folder = Path(self.path).expanduser()
        if adapter_complete(folder):
            return folder
        if store is None or not self.store_key:
            raise FileNotFoundError(f"adapter {self.path} is not on this machine and has no copy in the artifact store")
        if pull_folder(store, self.store_key, folder) == 0 or not adapter_complete(folder):
            raise FileNotFoundError(f"adapter {self.path} is neither on this machine nor in the store at {store.uri(self.store_key)}")
        return folder


def lift_flat_fields(data: Any) -> Any:
    """A record written with flat `adapter_path`/`adapter_key`/`base_model` fields, as one with `adapter`."""
    if not isinstance(data, dict) or "adapter" in data or not ({"adapter_path", "adapter_key", "base_model"} & data.keys()):
        return data
    data = dict(data)
    path, key, base = data.pop("adapter_path", None), data.pop("adapter_key", None), data.pop("base_model", None)
    data["adapter"] = AdapterRecord(path=path, store_key=key, base_model=base) if path else None
    return data
