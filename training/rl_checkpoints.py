"""CISPO checkpoints: the peft adapter, the optimizer state, and a JSON sidecar per checkpoint.

Layout under the run folder:

    checkpoints/step-000010/   adapter_config.json, adapter_model.safetensors (peft),
                               trainer_state.pt (optimizer state, step), searchsmith_adapter.json (sidecar)
    checkpoints/latest.json    {"step": 10, "path": "checkpoints/step-000010"}
    adapter/                   the final adapter + its sidecar (what `cispo_checkpoint` serves)
    metrics.jsonl              one row per step;  crashes.jsonl  every crashed rollout attempt
    rewards.jsonl              every rollout's reward with all its components (and its scores)

Why the optimizer state: AdamW's moments are part of the trajectory of training; resuming with
fresh moments after a crash would not continue the same run (with them, and with step-seeded
sampling, a resumed run reproduces the uninterrupted one: tested). A checkpoint is written to
a temporary folder and renamed into place, and `latest.json` is replaced last, so a crash while
saving leaves the previous checkpoint as the latest.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from agent.adapter_sidecar import sidecar_file, write_sidecar

CHECKPOINTS = "checkpoints"
LATEST = "latest.json"
STATE_FILE = "trainer_state.pt"


def checkpoint_path(out_dir: str | Path, step: int) -> Path:
    return Path(out_dir) / CHECKPOINTS / f"step-{step:06d}"


def write_json_atomic(path: Path, data: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        json.dump(data, handle, indent=2, sort_keys=True, default=str)
    os.replace(tmp, path)


def save_checkpoint(model: Any, optimizer: Any, out_dir: str | Path, step: int, sidecar: dict[str, Any],
                    state: dict[str, Any] | None = None, keep: int | None = None) -> Path:
    """Write checkpoint `step` (steps completed) atomically and point `latest.json` at it."""
    import torch

    target = checkpoint_path(out_dir, step)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=target.parent))
    try:
        model.save_pretrained(str(tmp))
        torch.save({"optimizer": optimizer.state_dict(), "step": step, **(state or {})}, tmp / STATE_FILE)
        write_sidecar(tmp, sidecar)
        if target.exists():
            shutil.rmtree(target)
        os.rename(tmp, target)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    write_json_atomic(target.parent / LATEST, {"step": step, "path": str(target.relative_to(Path(out_dir)))})
    if keep is not None and keep > 0:
        _prune_old(target.parent, keep)
    return target


def _prune_old(folder: Path, keep: int) -> None:
    steps = sorted(p for p in folder.glob("step-*") if p.is_dir() and sidecar_file(p) is not None)
    for old in steps[:-keep]:
        shutil.rmtree(old, ignore_errors=True)


def latest_checkpoint(out_dir: str | Path) -> Path | None:
    """The newest complete checkpoint (by `latest.json`, else by scanning), or None."""
    folder = Path(out_dir) / CHECKPOINTS
    pointer = folder / LATEST
    if pointer.is_file():
        path = Path(out_dir) / json.loads(pointer.read_text())["path"]
        if _complete(path):
            return path
    candidates = sorted(p for p in folder.glob("step-*") if _complete(p))
    return candidates[-1] if candidates else None


def _complete(path: Path) -> bool:
    return sidecar_file(path) is not None and (path / STATE_FILE).is_file() and (path / "adapter_config.json").is_file()


def load_checkpoint(model: Any, optimizer: Any, path: str | Path) -> dict[str, Any]:
    """Restore the adapter weights into `model` and the optimizer state; returns the saved state."""
    import torch
    from peft import set_peft_model_state_dict
    from peft.utils import load_peft_weights

    path = Path(path)
    device = next(model.parameters()).device
    weights = load_peft_weights(str(path), device=str(device))
    result = set_peft_model_state_dict(model, weights)
    unexpected = getattr(result, "unexpected_keys", []) or []
    if unexpected:
        raise RuntimeError(f"checkpoint {path} does not match the model's adapter: unexpected keys {unexpected[:3]}")
    state = torch.load(path / STATE_FILE, map_location=device, weights_only=False)
    optimizer.load_state_dict(state["optimizer"])
    return state


def export_adapter(model: Any, folder: str | Path, sidecar: dict[str, Any]) -> Path:
    """The final adapter (peft folder + sidecar), replaced atomically."""
    folder = Path(folder)
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{folder.name}.tmp-", dir=folder.parent))
    try:
        model.save_pretrained(str(tmp))
        write_sidecar(tmp, sidecar)
        if folder.exists():
            shutil.rmtree(folder)
        os.rename(tmp, folder)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return folder


def read_metrics(path: str | Path, before_step: int | None = None) -> list[dict[str, Any]]:
    """Rows of a per-step JSONL log (`metrics.jsonl`, `rewards.jsonl`), only steps < `before_step`
    when given: a resume truncates what the interrupted run logged past its checkpoint."""
    path = Path(path)
    if not path.is_file():
        return []
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    return [r for r in rows if before_step is None or r["step"] < before_step]


def write_metrics(path: str | Path, rows: list[dict[str, Any]]) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text("".join(json.dumps(r, default=str) + "\n" for r in rows), encoding="utf-8")
    os.replace(tmp, path)


def append_jsonl(path: str | Path, rows: list[dict[str, Any]]) -> None:
    if not rows:
        return
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a", encoding="utf-8") as handle:
        for row in rows:
            handle.write(json.dumps(row, default=str) + "\n")
