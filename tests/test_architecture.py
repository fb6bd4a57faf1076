"""The stage order is a contract: each package imports only the packages below it, and only the
Dagster layer imports dagster (`.importlinter`, checked by import-linter over every import
statement, including those inside functions)."""

import configparser
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def lint_imports() -> list[str]:
    script = shutil.which("lint-imports", path=str(Path(sys.executable).parent)) or shutil.which("lint-imports")
    assert script, "import-linter is a dev dependency (make install)"
    return [script, "--no-cache"]


def test_the_stage_order_and_the_dagster_boundary_hold():
    result = subprocess.run(lint_imports(), cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    assert "2 kept, 0 broken" in result.stdout


def test_the_contract_names_every_package_and_the_docs_draw_the_same_order():
    """A new top-level package joins a layer (or the check would silently not see it), and
    docs/architecture.md shows the layers the contract enforces."""
    config = configparser.ConfigParser()
    config.read(ROOT / ".importlinter")
    roots = config["importlinter"]["root_packages"].split()
    packages = sorted(p.name for p in ROOT.iterdir() if (p / "__init__.py").exists() and p.name not in {"tests", "bench"})
    assert sorted(roots) == packages
    layers = config["importlinter:contract:stage-order"]["layers"].split()
    assert sorted(layers) == packages
    doc = (ROOT / "docs" / "architecture.md").read_text()
    assert " <- ".join(reversed(layers)) in doc


def test_a_broken_layer_is_caught(tmp_path):
    """The check itself: a copy of the tree in which corpus imports training fails it."""
    copy = tmp_path / "repo"
    shutil.copytree(ROOT, copy, ignore=shutil.ignore_patterns(".venv*", ".git", ".searchsmith", "tests", "*.egg-info", "__pycache__", "shared"))
    (copy / "corpus" / "reaches_up.py").write_text("from training.per_customer import rl_config\n")
    result = subprocess.run(lint_imports(), cwd=copy, capture_output=True, text=True, timeout=300,
                            env={"PYTHONPATH": str(copy), "PATH": str(Path(sys.executable).parent)})
    assert result.returncode != 0 and "corpus.reaches_up -> training.per_customer" in result.stdout, result.stdout[-3000:]


def test_the_readme_layout_table_lists_every_package_and_each_module_it_names_exists():
    """The README's layout table is how a newcomer finds things: a row for every package, no row
    for a folder that is gone, and any module a row names (`adapter_record.py`) is in that folder."""
    import re

    readme = (ROOT / "README.md").read_text()
    table = readme[readme.index("## Layout"):]
    rows = dict(re.findall(r"^\| `(\w+)/` \| (.+) \|$", table, flags=re.MULTILINE))
    packages = sorted(p.name for p in ROOT.iterdir() if (p / "__init__.py").exists() and p.name not in {"tests", "bench"})
    assert not set(packages) - set(rows), f"packages without a README layout row: {sorted(set(packages) - set(rows))}"
    for folder, text in rows.items():
        assert (ROOT / folder).is_dir(), f"README layout names {folder}/, which does not exist"
        for module in re.findall(r"`(\w+\.py)`", text):
            assert (ROOT / folder / module).is_file(), f"README layout: {folder}/{module} does not exist"
