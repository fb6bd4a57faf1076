"""The git source against real repositories made with the git CLI and served as file:// URLs."""

from __future__ import annotations

import base64
import os
import subprocess
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from core.config import GitHubSource
from corpus.sources import github
from corpus.sources.base import Failed, Fetched, PreviousItem, SourceError, Unchanged
from corpus.sources.github import GitHubConnector, build_auth, fetch_command, git_env, redact_url, run_git
from corpus.sync import sync_sources

GIT_IDENTITY = ["-c", "user.email=t@t", "-c", "user.name=t", "-c", "init.defaultBranch=main"]


@pytest.fixture(autouse=True)
def isolated_git(monkeypatch):
    """No user or system git configuration leaks into the tests (or out of them)."""
    monkeypatch.setenv("GIT_CONFIG_GLOBAL", os.devnull)
    monkeypatch.setenv("GIT_CONFIG_NOSYSTEM", "1")
    for name in ("GIT_DIR", "GIT_WORK_TREE", "GIT_CONFIG_COUNT"):
        monkeypatch.delenv(name, raising=False)


def git(repo: Path, *args: str) -> str:
    result = subprocess.run(["git", *GIT_IDENTITY, "-C", str(repo), *args], check=True, capture_output=True, text=True)
    return result.stdout.strip()


def make_repo(path: Path, files: dict[str, str | bytes], branch: str = "main") -> Path:
    path.mkdir(parents=True)
    git(path, "init", "--quiet", "--initial-branch", branch)
    write(path, files)
    commit(path, "initial")
    return path


def write(repo: Path, files: dict[str, str | bytes]) -> None:
    for name, content in files.items():
        target = repo / name
        target.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            target.write_bytes(content)
        else:
            target.write_text(content)


def commit(repo: Path, message: str) -> str:
    git(repo, "add", "-A")
    git(repo, "commit", "--quiet", "-m", message)
    return git(repo, "rev-parse", "HEAD")


def connector(repo: Path | str, work: Path, max_bytes: int = 1_000_000, **fields) -> GitHubConnector:
    url = repo.as_uri() if isinstance(repo, Path) else repo
    source = GitHubSource(type="github", url=url, **fields)
    return GitHubConnector(source, f"github:{url}", max_bytes, work)


def previous_from(events) -> dict[str, PreviousItem]:
    return {e.uri: PreviousItem(e.version, dict(e.validators)) for e in events if not isinstance(e, Failed)}


@pytest.fixture
def read_log(monkeypatch) -> list[str]:
    """Every blob id the connector reads."""
    reads: list[str] = []
    original = github.BlobReader.read

    def spy(self, sha: str):
        reads.append(sha)
        return original(self, sha)

    monkeypatch.setattr(github.BlobReader, "read", spy)
    return reads


DOCS = {
    "README.md": "# Project\n\nWhat it does.\n",
    "docs/guide.md": "# Guide\n\nHow to use it.\n",
    "docs/faq.md": "# FAQ\n\nQuestions.\n",
    "src/app.py": "def main():\n    return 1\n",
    "build/out.txt": "generated\n",
}


def test_first_scan_fetches_every_included_file(tmp_path, read_log):
    repo = make_repo(tmp_path / "repo", DOCS)
    head = git(repo, "rev-parse", "HEAD")
    events = list(connector(repo, tmp_path / "work").scan({}))

    assert all(isinstance(e, Fetched) for e in events)
    by_path = {e.name: e for e in events}
    assert set(by_path) == set(DOCS)
    readme = by_path["README.md"]
    assert readme.uri == f"{repo.as_uri()}@main:README.md"
    assert readme.version == git(repo, "rev-parse", "HEAD:README.md")
    assert readme.data == DOCS["README.md"].encode()
    assert readme.validators == {"commit": head}
    assert readme.metadata == {"path": "README.md", "commit": head}
    assert len(read_log) == len(DOCS)
    assert (tmp_path / "work" / "repo.git" / "HEAD").is_file()  # the persistent local repository
    assert not (tmp_path / "work" / "repo.git" / "FETCH_HEAD").exists()  # the URL is not written down


def test_rescan_without_changes_reads_nothing(tmp_path, read_log):
    repo = make_repo(tmp_path / "repo", DOCS)
    first = list(connector(repo, tmp_path / "work").scan({}))
    read_log.clear()

    again = list(connector(repo, tmp_path / "work").scan(previous_from(first)))

    assert all(isinstance(e, Unchanged) for e in again)
    assert {e.uri for e in again} == {e.uri for e in first}
    assert read_log == []


def test_sync_counts_after_change_delete_and_add(tmp_path, read_log):
    repo = make_repo(tmp_path / "repo", DOCS)
    source = connector(repo, tmp_path / "work")
    initial = sync_sources([source], None, "code")
    assert initial.counts.as_dict() == {"added": 5, "changed": 0, "deleted": 0, "unchanged": 0, "quarantined": 0, "fetched": 5}

    write(repo, {"docs/guide.md": "# Guide\n\nHow to use it, now with examples.\n", "docs/new.md": "# New\n\nFresh.\n"})
    (repo / "docs" / "faq.md").unlink()
    commit(repo, "change, delete, add")
    read_log.clear()

    changed = sync_sources([source], initial.documents, "code")
    assert changed.counts.as_dict() == {"added": 1, "changed": 1, "deleted": 1, "unchanged": 3, "quarantined": 0, "fetched": 2}
    assert sorted(read_log) == sorted(git(repo, "rev-parse", f"HEAD:docs/{n}.md") for n in ("guide", "new"))

    read_log.clear()
    repeat = sync_sources([source], changed.documents, "code")
    assert repeat.counts.as_dict() == {"added": 0, "changed": 0, "deleted": 0, "unchanged": 5, "quarantined": 0, "fetched": 0}
    assert read_log == []
    live = repeat.documents.filter(~repeat.documents["deleted"])
    assert sorted(live["uri"].to_list()) == sorted(f"{repo.as_uri()}@main:{p}" for p in set(DOCS) - {"docs/faq.md"} | {"docs/new.md"})
    head = git(repo, "rev-parse", "HEAD")
    assert all(f'"commit": "{head}"' in v for v in live["validators"].to_list())  # validators follow the new commit


def test_rewritten_history_is_fetched_again(tmp_path):
    repo = make_repo(tmp_path / "repo", {"a.md": "# A\n\nfirst\n"})
    source = connector(repo, tmp_path / "work")
    first = list(source.scan({}))
    (repo / "a.md").write_text("# A\n\nrewritten\n")
    git(repo, "add", "-A")
    git(repo, "commit", "--quiet", "--amend", "-m", "rewritten")  # not a fast-forward

    events = list(source.scan(previous_from(first)))
    assert [type(e) for e in events] == [Fetched]
    assert events[0].data == b"# A\n\nrewritten\n"


def test_include_and_exclude_globs(tmp_path):
    repo = make_repo(tmp_path / "repo", DOCS)
    events = list(connector(repo, tmp_path / "work", include=["**/*.md", "src/**"], exclude=["docs/faq.md"]).scan({}))
    assert sorted(e.name for e in events) == ["README.md", "docs/guide.md", "src/app.py"]


def test_symlinks_and_submodules_are_never_read(tmp_path, read_log):
    repo = make_repo(tmp_path / "repo", {"README.md": "# Readme\n\ntext\n"})
    (repo / "passwd").symlink_to("/etc/passwd")
    (repo / "inside.md").symlink_to("README.md")
    git(repo, "add", "-A")
    # A submodule entry (gitlink) without a real submodule: only the tree entry matters.
    git(repo, "update-index", "--add", "--cacheinfo", f"160000,{git(repo, 'rev-parse', 'HEAD')},vendor/lib")
    git(repo, "commit", "--quiet", "-m", "links")
    link_blob = git(repo, "rev-parse", "HEAD:passwd")

    events = list(connector(repo, tmp_path / "work").scan({}))

    assert [e.name for e in events] == ["README.md"]
    assert link_blob not in read_log
    assert read_log == [git(repo, "rev-parse", "HEAD:README.md")]


def test_oversize_blob_fails_without_being_read(tmp_path, read_log):
    repo = make_repo(tmp_path / "repo", {"big.txt": "x" * 500, "small.txt": "small\n"})
    events = {e.uri.rsplit(":", 1)[1]: e for e in connector(repo, tmp_path / "work", max_bytes=100).scan({})}

    assert isinstance(events["big.txt"], Failed)
    assert "500" in events["big.txt"].reason and "100" in events["big.txt"].reason
    assert isinstance(events["small.txt"], Fetched)
    assert read_log == [git(repo, "rev-parse", "HEAD:small.txt")]


def test_branch_head_means_the_remote_default_branch(tmp_path):
    repo = make_repo(tmp_path / "repo", {"a.md": "# A\n\non trunk\n"}, branch="trunk")
    events = list(connector(repo, tmp_path / "work", branch="HEAD").scan({}))
    assert [(e.name, e.data) for e in events] == [("a.md", b"# A\n\non trunk\n")]
    assert events[0].uri == f"{repo.as_uri()}@HEAD:a.md"


def test_missing_branch_raises_source_error_naming_the_url(tmp_path):
    repo = make_repo(tmp_path / "repo", DOCS)
    with pytest.raises(SourceError) as raised:
        list(connector(repo, tmp_path / "work", branch="nope").scan({}))
    assert repo.as_uri() in str(raised.value)
    assert "nope" in str(raised.value)


def test_nonexistent_repository_raises_source_error(tmp_path):
    missing = tmp_path / "no-such-repo"
    with pytest.raises(SourceError) as raised:
        list(connector(missing, tmp_path / "work").scan({}))
    assert missing.as_uri() in str(raised.value)


def test_source_error_keeps_previous_documents_in_sync(tmp_path):
    repo = make_repo(tmp_path / "repo", DOCS)
    first = sync_sources([connector(repo, tmp_path / "work")], None, "code")
    broken = sync_sources([connector(repo, tmp_path / "work", branch="gone")], first.documents, "code")
    # Different branch means a different source key in real use; here the key is the same on purpose.
    assert broken.counts.deleted == 0 and broken.counts.quarantined == 1
    assert broken.documents.height == first.documents.height


@pytest.mark.parametrize("url", ["ext::sh -c touch% /tmp/pwned", "-uupload-pack=touch", "gopher://host/repo"])
def test_dangerous_urls_are_refused(tmp_path, url):
    with pytest.raises(SourceError):
        list(connector(url, tmp_path / "work").scan({}))


@pytest.mark.parametrize("branch", ["--upload-pack=x", "a:b", "+main", "a..b"])
def test_dangerous_branches_are_refused(tmp_path, branch):
    repo = make_repo(tmp_path / "repo", DOCS)
    with pytest.raises(SourceError):
        list(connector(repo, tmp_path / "work", branch=branch).scan({}))


def test_redact_url():
    assert redact_url("https://user:secret@github.com/org/repo.git") == "https://github.com/org/repo.git"
    assert redact_url("https://TOKEN@github.com/org/repo.git") == "https://github.com/org/repo.git"
    assert redact_url("ssh://git:pw@host:22/org/repo.git") == "ssh://git@host:22/org/repo.git"
    assert redact_url("git@github.com:org/repo.git") == "git@github.com:org/repo.git"
    assert redact_url("file:///srv/repo") == "file:///srv/repo"


def test_token_goes_to_git_through_the_environment_not_argv(tmp_path):
    url = "https://github.com/org/repo.git"
    clean, auth = build_auth(url, "MY_TOKEN", {"MY_TOKEN": "s3cret-token"})
    argv = fetch_command(tmp_path / "repo.git", clean, "main")
    env = git_env({"PATH": "/bin", "GIT_CONFIG_COUNT": "1", "GIT_CONFIG_KEY_0": "a.b", "GIT_CONFIG_VALUE_0": "c"}, auth.config())

    assert "s3cret-token" not in " ".join(argv)
    assert all(base64.b64encode(b"x-access-token:s3cret-token").decode() not in a for a in argv)
    assert env["GIT_CONFIG_COUNT"] == "2"  # appended after the caller's own entries
    assert env["GIT_CONFIG_KEY_1"] == "http.https://github.com/.extraHeader"
    expected = base64.b64encode(b"x-access-token:s3cret-token").decode()
    assert env["GIT_CONFIG_VALUE_1"] == f"Authorization: Basic {expected}"
    assert env["GIT_TERMINAL_PROMPT"] == "0"


def test_password_in_url_moves_into_the_header():
    clean, auth = build_auth("https://bob:pa%24s@example.com:8443/r.git", None, {})
    assert clean == "https://example.com:8443/r.git"
    assert auth.scope == "https://example.com:8443/"
    assert auth.header_value == "Basic " + base64.b64encode(b"bob:pa$s").decode()


def test_missing_token_variable_raises_source_error_naming_it(tmp_path, monkeypatch):
    monkeypatch.delenv("SEARCHSMITH_TEST_NO_TOKEN", raising=False)
    repo = make_repo(tmp_path / "repo", DOCS)
    with pytest.raises(SourceError, match="SEARCHSMITH_TEST_NO_TOKEN"):
        list(connector(repo, tmp_path / "work", token_env="SEARCHSMITH_TEST_NO_TOKEN").scan({}))


class _RecordingHandler(BaseHTTPRequestHandler):
    seen: list[tuple[str, str | None]] = []

    def do_GET(self):  # noqa: N802 - http.server's naming
        self.seen.append((self.path, self.headers.get("Authorization")))
        self.send_response(403)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args):
        pass


@pytest.mark.integration
def test_https_token_reaches_the_server_but_never_argv_or_errors(tmp_path, monkeypatch):
    for name in ("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY", "all_proxy", "ALL_PROXY"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("NO_PROXY", "127.0.0.1")
    monkeypatch.setenv("SEARCHSMITH_TEST_TOKEN", "tok-123456789")
    server = ThreadingHTTPServer(("127.0.0.1", 0), _RecordingHandler)
    _RecordingHandler.seen = []
    threading.Thread(target=server.serve_forever, daemon=True).start()
    argvs: list[list[str]] = []
    real_popen = subprocess.Popen

    def recording_popen(argv, *args, **kwargs):
        argvs.append(list(argv))
        return real_popen(argv, *args, **kwargs)

    monkeypatch.setattr(github.subprocess, "Popen", recording_popen)
    url = f"http://127.0.0.1:{server.server_address[1]}/org/repo.git"
    try:
        with pytest.raises(SourceError) as raised:
            list(connector(url, tmp_path / "work", token_env="SEARCHSMITH_TEST_TOKEN", branch="main").scan({}))
    finally:
        server.shutdown()
        server.server_close()

    expected = "Basic " + base64.b64encode(b"x-access-token:tok-123456789").decode()
    assert _RecordingHandler.seen and _RecordingHandler.seen[0][1] == expected
    assert url in str(raised.value)
    assert "tok-123456789" not in str(raised.value) and expected not in str(raised.value)
    assert argvs and not any("tok-123456789" in a or expected.split()[1] in a for argv in argvs for a in argv)
    config = (tmp_path / "work" / "repo.git" / "config").read_text()
    assert "tok-123456789" not in config and "extraHeader" not in config


def test_git_timeout_becomes_source_error():
    with pytest.raises(SourceError, match="timed out"):
        run_git(["sleep", "5"], dict(os.environ), 0.2, [], "slow thing")
