"""Bad customer files: each one is an invalid entry named by its path, never the end of every
other customer (in the registry, the CLI and the search service); misspelled keys are errors,
at the top level and inside every stage section (validated whole when a customer is loaded)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from starlette.testclient import TestClient

from assets.resources import CustomersResource
from core.config import CustomerConfig, CustomerConfigError, load_customer
from core.registry import CustomerRegistry, KnownCustomers
from serving.api import create_app
from serving.api_keys import ApiKeyStore
from tests.test_serving_api import Opener, indexes, records  # noqa: F401 - module fixtures: two real indexes

ROOT = Path(__file__).resolve().parents[1]
CLI = [sys.executable, "-m", "orchestration.cli"]
GOOD = "name: acme\nsources:\n  - {type: local, path: ./docs}\n"


def bad_customers_folder(root: Path) -> Path:
    """acme is fine; beside it a Latin-1 file, a folder named x.yaml, and a file whose name is not UTF-8."""
    folder = root / "customers"
    (folder / "docs").mkdir(parents=True)
    (folder / "acme.yaml").write_text(GOOD)
    (folder / "latin1.yaml").write_bytes("name: caf\u00e9\nsources: []\n".encode("latin-1"))
    (folder / "x.yaml").mkdir()
    with open(os.path.join(os.fsencode(folder), b"bad\xffname.yaml"), "w") as handle:
        handle.write(GOOD.replace("acme", "other"))
    return folder


def test_unreadable_files_are_errors_that_name_them(tmp_path):
    folder = bad_customers_folder(tmp_path)
    with pytest.raises(CustomerConfigError, match=re.escape(str(folder / "latin1.yaml")) + ".*not UTF-8"):
        load_customer(folder / "latin1.yaml")
    with pytest.raises(CustomerConfigError, match=re.escape(str(folder / "x.yaml")) + ".*folder"):
        load_customer(folder / "x.yaml")


def test_registry_lists_every_bad_entry_and_keeps_the_good_customer(tmp_path):
    folder = bad_customers_folder(tmp_path)
    registry = CustomerRegistry(home=tmp_path / "home", folder=folder)
    customers, problems = registry.scan()
    assert sorted(customers) == ["acme", "other"]  # a non-UTF-8 *file name* is no reason to refuse a valid file
    assert sorted(p.path.name for p in problems) == ["latin1.yaml", "x.yaml"]
    assert registry.get("acme").name == "acme"


def test_known_customers_reread_the_files_only_when_they_change(tmp_path):
    """What the search service asks on every admitted request: a stat per file, a full load only after a change."""
    folder = bad_customers_folder(tmp_path)
    scans = []

    class CountingRegistry(CustomerRegistry):
        def scan(self):
            scans.append(1)
            return super().scan()

    known = KnownCustomers(CountingRegistry(home=tmp_path / "home", folder=folder))
    assert known.names() == {"acme", "other"} and known.names() == {"acme", "other"} and len(scans) == 1
    (folder / "beta.yaml").write_text(GOOD.replace("acme", "beta"))
    assert known.names() == {"acme", "beta", "other"} and len(scans) == 2
    (folder / "acme.yaml").write_text(GOOD + "limitz: 3\n")  # now invalid: acme is no longer served
    assert known.names() == {"beta", "other"} and len(scans) == 3
    (folder / "beta.yaml").unlink()
    assert known.names() == {"other"} and len(scans) == 4


def test_a_corrupt_registration_index_is_one_problem(tmp_path):
    folder = tmp_path / "customers"
    folder.mkdir()
    (folder / "acme.yaml").write_text(GOOD)
    (tmp_path / "home").mkdir()
    (tmp_path / "home" / "customers.json").write_bytes(b"\xff{not json")
    customers, problems = CustomerRegistry(home=tmp_path / "home", folder=folder).scan()
    assert list(customers) == ["acme"] and [p.path.name for p in problems] == ["customers.json"]


def test_misspelled_top_level_keys_are_named(tmp_path):
    path = tmp_path / "acme.yaml"
    path.write_text(GOOD + "limitz: {resync_retrain_share: 0.5}\nchunkng: {size_tokens: 64}\n")
    with pytest.raises(CustomerConfigError) as error:
        load_customer(path)
    message = str(error.value)
    assert str(path) in message
    assert "'chunkng' (did you mean 'chunking'?)" in message and "'limitz' (did you mean 'limits'?)" in message


SECTIONS = ("tasks", "benchmark", "training", "serving")


def test_every_section_the_repo_uses_is_accepted(tmp_path):
    """demo.yaml, the README's full example and each stage section still load."""
    assert load_customer(ROOT / "customers" / "demo.yaml").name == "demo"
    readme = (ROOT / "README.md").read_text()
    example = re.search(r"## A customer.*?```yaml\n(.*?)```", readme, flags=re.DOTALL).group(1)
    (tmp_path / "readme.yaml").write_text(example)
    config = load_customer(tmp_path / "readme.yaml")
    assert {"benchmark", "training", "serving"} <= config.model_fields_set
    (tmp_path / "all.yaml").write_text(GOOD + "".join(f"{section}:\n" for section in SECTIONS) + "demo_question: Who?\n")
    everything = load_customer(tmp_path / "all.yaml")
    assert {*SECTIONS, "demo_question"} <= everything.model_fields_set and everything.demo_question == "Who?"
    assert everything.training == CustomerConfig.model_fields["training"].default_factory()  # empty: the defaults
    demo = CustomerRegistry(home=tmp_path / "home", folder=ROOT / "customers")
    assert demo.get("demo").name == "demo" and demo.scan()[1] == []  # the whole demo file, every section


def test_the_tasks_domain_is_the_files_unless_the_section_sets_one(tmp_path):
    (tmp_path / "a.yaml").write_text(GOOD + "domain: finance\n")
    assert load_customer(tmp_path / "a.yaml").tasks.domain == "finance"
    (tmp_path / "b.yaml").write_text(GOOD + "domain: finance\ntasks: {domain: legal, max_seeds: 3}\n")
    assert load_customer(tmp_path / "b.yaml").tasks.domain == "legal"


def test_harness_overrides_keep_what_was_written(tmp_path):
    """Applied with `**` and recorded in sidecars as written: the keys set, never the defaults."""
    (tmp_path / "a.yaml").write_text(GOOD + "training: {harness: {view: compact, max_turns: 4}, rl: {harness: {max_turns: 6}}}\n")
    training = load_customer(tmp_path / "a.yaml").training
    assert dict(training.harness) == {"view": "compact", "max_turns": 4}
    assert {**training.harness, **training.rl.harness} == {"view": "compact", "max_turns": 6}
    assert training.rl.model_dump()["harness"] == {"max_turns": 6}
    assert not load_customer(ROOT / "customers" / "demo.yaml").serving.promotion.allow_nx  # typed all the way down
    (tmp_path / "b.yaml").write_text(GOOD + "benchmark: {harness: {max_turns: 0}}\n")
    with pytest.raises(CustomerConfigError, match="benchmark.harness.max_turns: Input should be greater than 0"):
        load_customer(tmp_path / "b.yaml")


# A file with one misspelled key in each stage section, and one in a harness override (a dict
# the harness would have silently ignored).
TYPOS = GOOD.replace("acme", "typo") + (
    "tasks: {max_seed: 20}\n"
    "benchmark: {k: 5, harness: {max_turn: 3}}\n"
    "training:\n  base_model: smollm2\n  sft: {max_lenght: 1024, max_steps: 2}\n  rl: {steps: 1, harness: {token_budgt: 2048}}\n"
    "serving: {promotion: {margn: 0.1}}\n"
)
TYPO_PATHS = {
    "tasks.max_seed": "max_seeds", "benchmark.harness.max_turn": "max_turns", "training.sft.max_lenght": "max_length",
    "training.rl.harness.token_budgt": "token_budget", "serving.promotion.margn": "margin",
}


def assert_names_every_typo(message: str, path: Path) -> None:
    assert str(path) in message
    for key, meant in TYPO_PATHS.items():
        assert f"{key}: unknown key (did you mean {meant!r}?)" in message, message


def test_unknown_nested_keys_are_named_by_path_and_file(tmp_path):
    folder = tmp_path / "customers"
    (folder / "docs").mkdir(parents=True)
    (folder / "acme.yaml").write_text(GOOD)
    (folder / "typo.yaml").write_text(TYPOS)
    registry = CustomerRegistry(home=tmp_path / "home", folder=folder)
    customers, problems = registry.scan()
    assert list(customers) == ["acme"] and [p.path.name for p in problems] == ["typo.yaml"]
    assert_names_every_typo(problems[0].reason, folder / "typo.yaml")
    with pytest.raises(CustomerConfigError) as error:
        registry.add(folder / "typo.yaml")
    assert_names_every_typo(str(error.value), folder / "typo.yaml")


def test_the_dagster_resource_refuses_a_file_with_an_unknown_nested_key(tmp_path):
    folder = tmp_path / "customers"
    (folder / "docs").mkdir(parents=True)
    (folder / "acme.yaml").write_text(GOOD)
    (folder / "typo.yaml").write_text(TYPOS)
    resource = CustomersResource(folder=str(folder), home=str(tmp_path / "home"))
    assert resource.get("acme").name == "acme"
    with pytest.raises(CustomerConfigError, match="unknown customer 'typo'") as error:
        resource.get("typo")
    assert_names_every_typo(str(error.value), folder / "typo.yaml")


def cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*CLI, *args], env=env, cwd=ROOT, capture_output=True, text=True, timeout=600)


def test_cli_lists_bad_files_as_invalid_and_serves_the_good_customer(tmp_path, searchsmith_home):
    folder = bad_customers_folder(tmp_path)
    env = {**os.environ, "SEARCHSMITH_CUSTOMERS_DIR": str(folder)}
    listed = cli(env, "customers", "list", "--json")
    assert listed.returncode == 0, listed.stderr[-2000:]
    payload = json.loads(listed.stdout)
    assert payload["customers"] == ["acme", "other"]
    assert sorted(Path(p).name for p in payload["invalid"]) == ["latin1.yaml", "x.yaml"]
    human = cli(env, "customers", "list")
    assert human.returncode == 0 and f"invalid: {folder / 'x.yaml'}: is a folder" in human.stdout
    key = cli(env, "keys", "create", "acme", "--json")
    assert key.returncode == 0 and json.loads(key.stdout)["key"], key.stdout + key.stderr[-2000:]


def test_cli_lists_and_refuses_a_file_with_an_unknown_nested_key(tmp_path, searchsmith_home):
    folder = tmp_path / "customers"
    (folder / "docs").mkdir(parents=True)
    (folder / "acme.yaml").write_text(GOOD)
    (folder / "typo.yaml").write_text(TYPOS)
    env = {**os.environ, "SEARCHSMITH_CUSTOMERS_DIR": str(folder)}
    listed = cli(env, "customers", "list", "--json")
    assert listed.returncode == 0, listed.stderr[-2000:]
    payload = json.loads(listed.stdout)
    assert payload["customers"] == ["acme"] and payload["invalid"] == [str(folder / "typo.yaml")]
    assert_names_every_typo(payload["problems"][0]["reason"], folder / "typo.yaml")
    elsewhere = tmp_path / "elsewhere.yaml"
    elsewhere.write_text(TYPOS.replace("./docs", str(folder / "docs")))
    added = cli(env, "customers", "add", str(elsewhere))
    assert added.returncode == 1 and added.stdout == ""
    assert_names_every_typo(added.stderr, elsewhere)
    assert json.loads(cli(env, "customers", "list", "--json").stdout)["customers"] == ["acme"]  # nothing was registered


def test_search_service_answers_the_good_customer_beside_bad_files(tmp_path, indexes):  # noqa: F811
    folder = bad_customers_folder(tmp_path)
    keys = ApiKeyStore(tmp_path / "keys.json")
    key = keys.create_key("acme")
    registry = CustomerRegistry(home=tmp_path / "home", folder=folder)
    app = create_app(keys, lambda: set(registry.customers()), Opener(indexes), lambda customer: "heuristic")
    with TestClient(app) as client:
        response = client.post("/v1/search", json={"customer": "acme", "query": "first final", "k": 3},
                               headers={"Authorization": f"Bearer {key}"})
    assert response.status_code == 200, response.text
    assert response.json()["documents"]
