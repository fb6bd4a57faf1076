"""General searcher adapters this project ships, and the one way to name, check and export them.

Why ship a searcher: on two CPU cores a fresh LoRA needs about 40 minutes of SFT over some 120
teacher trajectories before it searches at all (`bench/learning.py`: answer found 0.000 untrained,
0.353 after it, 0.467 after 30 more steps, 0.513 after 40 more). A per-customer run that takes minutes (the demo, a
resync fine-tune) can only adapt a searcher that already exists, as Context-1 adapts one trained model. So the customer file
may name a starting adapter (`training.init_adapter`): a folder in this package (`smollm2-searcher`)
or any adapter folder, and the customer's SFT continues it instead of a fresh one.

A shipped searcher is an ordinary adapter folder (peft's files plus the sidecar) exported from a
run of `bench/learning.py` by `python -m training.searchers export SRC DST`: weights in bf16
(half the bytes, well inside the adapter's own noise), no paths of the machine that trained it,
and the sidecar's record of how it was made and what it measured.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from agent.adapter_sidecar import read_sidecar, write_sidecar

PACKAGED_DIR = Path(__file__).resolve().parent
ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"


def packaged_searchers() -> list[str]:
    """Names of the searchers shipped in this package."""
    return sorted(p.name for p in PACKAGED_DIR.iterdir() if (p / ADAPTER_WEIGHTS).is_file())


def searcher_dir(name_or_path: str, resolve: Callable[[str], Path] = Path) -> Path:
    """The adapter folder `name_or_path` names: a packaged searcher's name, else a path (made
    absolute by `resolve`, e.g. against the customer file's folder). An error names what is missing."""
    if (PACKAGED_DIR / name_or_path / ADAPTER_WEIGHTS).is_file():
        return PACKAGED_DIR / name_or_path
    folder = resolve(name_or_path)
    missing = [name for name in (ADAPTER_CONFIG, ADAPTER_WEIGHTS) if not (Path(folder) / name).is_file()]
    if missing:
        raise FileNotFoundError(f"training.init_adapter {name_or_path!r}: no adapter at {folder} (missing {', '.join(missing)}); "
                                f"packaged searchers: {', '.join(packaged_searchers()) or 'none'}")
    return Path(folder)


def adapter_digest(folder: str | Path) -> str:
    """A content hash of the adapter's weights and shape: what a run that continues it is keyed by."""
    digest = hashlib.sha256()
    for name in (ADAPTER_CONFIG, ADAPTER_WEIGHTS):
        with open(Path(folder) / name, "rb") as handle:
            for block in iter(lambda: handle.read(1 << 20), b""):
                digest.update(block)
    return digest.hexdigest()[:16]


def check_continuable(folder: Path, base_model: str, harness_profile: dict[str, Any]) -> dict[str, Any]:
    """The starting adapter's sidecar, after checking that it was trained on `base_model` under
    `harness_profile` (the customer's student profile): a searcher continued under other budgets
    or another view would be taught one prompt and judged under another."""
    sidecar = read_sidecar(folder)
    trained_on = str(sidecar.get("base_model") or "")
    if trained_on and trained_on.lower() != str(base_model).lower():
        raise ValueError(f"training.init_adapter {folder}: trained on base model {trained_on!r}, "
                         f"the customer's training.base_model is {base_model!r}")
    recorded = sidecar.get("harness_profile") or {}
    differs = {key: (recorded.get(key), value) for key, value in harness_profile.items()
               if key in recorded and recorded[key] != value}
    if differs:
        listed = ", ".join(f"{key} {mine!r} (the adapter's {theirs!r})" for key, (theirs, mine) in sorted(differs.items()))
        raise ValueError(f"training.init_adapter {folder}: the customer's training.harness differs from the profile the "
                         f"adapter was trained under: {listed}; set training.harness to the adapter's profile")
    return sidecar


def export_searcher(source: str | Path, target: str | Path, base_model: str, dtype: str = "bfloat16") -> Path:
    """Copy the adapter at `source` to `target` as a shippable searcher: weights cast to `dtype`,
    `base_model` (a name that resolves anywhere, e.g. `smollm2`) instead of the trainer's path,
    and the sidecar without machine paths plus where it came from."""
    import torch
    from safetensors.torch import load_file, save_file

    source, target = Path(source), Path(target)
    sidecar = read_sidecar(source)
    if not sidecar:
        raise FileNotFoundError(f"{source}: no searchsmith_adapter.json; export adapters this project trained")
    target.mkdir(parents=True, exist_ok=True)
    weights = load_file(str(source / ADAPTER_WEIGHTS))
    save_file({name: tensor.to(getattr(torch, dtype)).contiguous() for name, tensor in weights.items()},
              str(target / ADAPTER_WEIGHTS), metadata={"format": "pt"})
    config = json.loads((source / ADAPTER_CONFIG).read_text(encoding="utf-8"))
    config["base_model_name_or_path"] = base_model
    (target / ADAPTER_CONFIG).write_text(json.dumps(config, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    exported = {key: value for key, value in sidecar.items() if key not in {"base_model_path", "loss_curve"}}
    lineage = dict(exported.get("lineage") or {})
    if lineage.get("init_adapter"):  # a continued searcher: the folder's name (its digest is beside it)
        lineage["init_adapter"] = Path(lineage["init_adapter"]).name
        exported["lineage"] = lineage
    exported.update(base_model=base_model,
                    export={"source_run": sidecar.get("lineage", {}).get("run_id"), "dtype": dtype,
                            "source_digest": adapter_digest(source)})
    write_sidecar(target, exported)
    return target
