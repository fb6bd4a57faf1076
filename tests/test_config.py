import json
from pathlib import Path

import pytest

from core.config import CustomerConfigError, load_customer
from core.registry import CustomerRegistry

VALID = """
name: acme
domain: finance
schedule: "0 4 * * *"
sources:
  - {type: local, path: ./docs, include: ["**/*.md"], exclude: []}
  - {type: s3, bucket: b, prefix: docs/, endpoint_url: "http://127.0.0.1:8333"}
  - {type: github, url: "https://github.com/org/repo.git", branch: main, token_env: GITHUB_TOKEN}
  - {type: web, seeds: ["https://example.com/docs/"], allow_hosts: [example.com], max_pages: 500, allow_private: false}
"""


def write(tmp_path: Path, text: str, name: str = "acme.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_design_example_loads_and_resolves_relative_paths(tmp_path):
    config = load_customer(write(tmp_path, VALID))
    assert config.name == "acme" and config.domain == "finance"
    assert [s.type for s in config.sources] == ["local", "s3", "github", "web"]
    assert config.resolve("./docs") == (tmp_path / "docs").resolve()


@pytest.mark.parametrize(
    "text, field",
    [
        (VALID.replace("name: acme", "name: Acme_Corp"), "name"),
        (VALID.replace("domain: finance", "domain: medicine"), "domain"),
        (VALID.replace('"0 4 * * *"', '"daily"'), "schedule"),
        (VALID.replace("type: s3,", "type: ftp,"), "sources.1"),
        (VALID.replace("bucket: b, ", ""), "sources.1.s3.bucket"),
        # Values a sync would only trip over later (an empty scope, a missing bucket): refused here.
        (VALID.replace("path: ./docs", 'path: " "'), "sources.0.local.path: must not be empty"),
        (VALID.replace("bucket: b,", 'bucket: "docs/2024",'), "sources.1.s3.bucket: 'docs/2024' is not a bucket name"),
        (VALID.replace("bucket: b,", 'bucket: "s3://b",'), "put a folder in `prefix`"),
        (VALID.replace('url: "https://github.com/org/repo.git"', 'url: ""'), "sources.2.github.url: must not be empty"),
        (VALID.replace('"https://example.com/docs/"', '"example.com/docs"'), "sources.3.web.seeds: seed 'example.com/docs'"),
        (VALID.replace('"https://example.com/docs/"', '"ftp://example.com/"'), "is not an http(s) address"),
        (VALID + "training:\n  rl: {beta_end: 0}\n", "training.rl.beta_end"),  # F-beta needs a positive beta
        (VALID + "training:\n  rl: {keep_checkpoints: 0}\n", "training.rl.keep_checkpoints"),
    ],
)
def test_errors_name_file_and_field(tmp_path, text, field):
    path = write(tmp_path, text)
    with pytest.raises(CustomerConfigError) as error:
        load_customer(path)
    message = str(error.value)
    assert str(path) in message and field in message


def test_not_yaml_and_missing_file(tmp_path):
    with pytest.raises(CustomerConfigError, match="not valid YAML"):
        load_customer(write(tmp_path, "name: [unclosed"))
    with pytest.raises(CustomerConfigError, match="not found"):
        load_customer(tmp_path / "absent.yaml")


def test_registry_finds_folder_and_added_files(tmp_path):
    folder = tmp_path / "customers"
    folder.mkdir()
    write(folder, VALID)
    write(folder, "name: [broken", "broken.yaml")
    elsewhere = tmp_path / "other"
    elsewhere.mkdir()
    extra = write(elsewhere, VALID.replace("name: acme", "name: beta"), "beta.yaml")
    registry = CustomerRegistry(home=tmp_path / "home", folder=folder)
    registry.add(extra)
    customers, problems = registry.scan()
    assert sorted(customers) == ["acme", "beta"]
    assert [p.path.name for p in problems] == ["broken.yaml"]
    assert customers["beta"].base_dir == elsewhere.resolve()
    with pytest.raises(CustomerConfigError, match="unknown customer 'gamma'"):
        registry.get("gamma")


def test_remove_forgets_a_registered_file_by_name_or_by_path_and_keeps_the_file(tmp_path):
    folder = tmp_path / "customers"
    folder.mkdir()
    write(folder, VALID)  # acme: in the folder, not registered
    elsewhere = tmp_path / "other"
    elsewhere.mkdir()
    beta = write(elsewhere, VALID.replace("name: acme", "name: beta"), "beta.yaml")
    broken = write(elsewhere, VALID.replace("name: acme", "name: gamma").replace("bucket: b,", 'bucket: "s3://b",'), "gamma.yaml")
    registry = CustomerRegistry(home=tmp_path / "home", folder=folder)
    registry.add(beta)
    registered = json.loads(registry.index_path.read_text())
    registry._write({**registered, "gamma": str(broken)})  # registered while it still validated
    assert [p.path for p in registry.scan()[1]] == [broken]
    assert registry.remove(str(broken)) == ("gamma", broken)  # no valid name: by its path
    assert registry.scan()[1] == [] and broken.exists()
    assert registry.remove("beta") == ("beta", beta)
    assert sorted(registry.customers()) == ["acme"] and beta.exists()
    with pytest.raises(CustomerConfigError, match="is in the customers folder, not registered"):
        registry.remove("acme")
    with pytest.raises(CustomerConfigError, match=r"no registered customer or file 'beta' \(registered: none\)"):
        registry.remove("beta")
