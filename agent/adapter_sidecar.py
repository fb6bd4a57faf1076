"""The sidecar beside every adapter our trainers write: one file name, written and read here.

Why a sidecar: a peft folder records weights and a base model path that may not resolve on the
machine that serves it. The sidecar records what the rest of the pipeline needs to run and judge
the adapter: the base model as given (`smollm2`, which resolves anywhere), the harness profile it
was trained under, its data lineage, settings and metrics. SFT adapters, CISPO adapters and each
RL step checkpoint carry the same file, so whatever reads an adapter folder (the policy loader,
the benchmark, the gate, resume) reads it the same way.

CISPO adapters written before the file was shared are named `checkpoint.json`; they are still
read (a run resumes from them), never written.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

SIDECAR = "searchsmith_adapter.json"
LEGACY_SIDECARS = ("checkpoint.json",)


def sidecar_file(folder: str | Path) -> Path | None:
    """The folder's sidecar (the current name first), or None when it has none."""
    folder = Path(folder).expanduser()
    for name in (SIDECAR, *LEGACY_SIDECARS):
        if (folder / name).is_file():
            return folder / name
    return None


def read_sidecar(folder: str | Path) -> dict[str, Any]:
    """The folder's sidecar; {} when there is none (an adapter that is not ours)."""
    path = sidecar_file(folder)
    return json.loads(path.read_text(encoding="utf-8")) if path is not None else {}


def write_sidecar(folder: str | Path, sidecar: dict[str, Any]) -> Path:
    """Write the sidecar atomically (a reader never sees half a file); returns its path."""
    path = Path(folder) / SIDECAR
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        json.dump(sidecar, handle, indent=2, sort_keys=True, default=str)
    os.replace(tmp, path)
    return path
