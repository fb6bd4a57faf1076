"""Stage packages hold the logic and never import dagster (checked in a fresh interpreter)."""

import pkgutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
STAGES = ["core", "corpus", "search", "agent", "synth", "training", "evaluation", "serving"]


def stage_modules() -> list[str]:
    names = []
    for stage in STAGES:
        names.append(stage)
        for module in pkgutil.walk_packages([str(ROOT / stage)], prefix=f"{stage}."):
            names.append(module.name)
    return names


def test_stage_packages_do_not_import_dagster():
    modules = stage_modules()
    assert len(modules) > len(STAGES)
    code = "import importlib, sys\n" + "".join(f"importlib.import_module({m!r})\n" for m in modules) + (
        "bad = sorted(m for m in sys.modules if m == 'dagster' or m.startswith('dagster.'))\n"
        "print('DAGSTER' if bad else 'CLEAN')\n"
    )
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip().endswith("CLEAN"), modules
