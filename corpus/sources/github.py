"""Git source: a shallow fetch of one branch into a persistent local repository, then the tree.

Works with any git URL the git CLI understands (https with a token, ssh, file://). Change
detection needs no content hashing: a blob id *is* a content fingerprint, so `ls-tree` alone says
which files changed since the previous sync and only those blobs are read (one `cat-file --batch`
process for all of them, not one process per file).

Secrets: a token (from the environment variable named by `token_env`, or a password embedded in
an https URL) reaches git only as an `http.<origin>/.extraHeader` entry passed through the
GIT_CONFIG_COUNT environment variables, so it never appears in argv (visible to every local user
through `ps`), in the repository's config or FETCH_HEAD, in document URIs, or in error messages.
No remote is configured in the local repository; every fetch names the (credential-free) URL.
Needs git >= 2.31 (GIT_CONFIG_COUNT, `fetch --no-write-fetch-head`).
"""

from __future__ import annotations

import base64
import logging
import os
import re
import signal
import subprocess
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Iterator, Mapping
from urllib.parse import unquote, urlsplit, urlunsplit

from core.config import GitHubSource
from corpus.sources.base import Failed, Fetched, PreviousItem, ScanEvent, SourceError, Unchanged, glob_match

log = logging.getLogger(__name__)

DEFAULT_TIMEOUT_S = 300.0
FETCHED_REF = "refs/searchsmith/fetched"  # keeps the fetched commit reachable between syncs
URL_SCHEMES = {"https", "http", "ssh", "git", "file", "git+ssh", "ssh+git"}
SYMLINK_MODE = "120000"
# Variables that would point git at another repository than the one we pass with --git-dir.
_REPO_LOCATING_ENV = ("GIT_DIR", "GIT_WORK_TREE", "GIT_INDEX_FILE", "GIT_OBJECT_DIRECTORY",
                      "GIT_ALTERNATE_OBJECT_DIRECTORIES", "GIT_COMMON_DIR", "GIT_NAMESPACE", "GIT_CEILING_DIRECTORIES")
_URL_USERINFO = re.compile(r"(?P<scheme>[a-zA-Z][a-zA-Z0-9+.-]*://)[^/@\s]+@")


# --- URLs and secrets --------------------------------------------------------------------------


def redact_url(url: str) -> str:
    """The URL as it may be recorded and shown: no password, and no user name for http(s).

    An http user name is often the token itself (`https://TOKEN@github.com/...`), while an ssh
    user name (`ssh://git@host/...`) is part of the address and not a secret.
    """
    if "://" not in url:
        return url  # a path or scp-like `git@host:org/repo.git`: nothing secret in it
    parts = urlsplit(url)
    if "@" not in parts.netloc:
        return url
    userinfo, _, hostport = parts.netloc.rpartition("@")
    if parts.scheme.lower() in {"http", "https"}:
        netloc = hostport
    else:
        netloc = f"{userinfo.split(':', 1)[0]}@{hostport}"
    return urlunsplit(parts._replace(netloc=netloc))


def _split_url_credentials(url: str) -> tuple[str, str | None]:
    """Move an https `user:password@` out of the URL, as `user:password` for a Basic header.

    Only a URL with a password is rewritten: a bare user name may be meant for a credential
    helper, and git still needs it in the URL to ask one.
    """
    if "://" not in url:
        return url, None
    parts = urlsplit(url)
    if parts.scheme.lower() not in {"http", "https"} or parts.password is None:
        return url, None
    basic = f"{unquote(parts.username or '')}:{unquote(parts.password)}"
    return redact_url(url), basic


def validate_url(url: str) -> None:
    """Refuse what git would treat as an option or as a command (`ext::sh -c ...`)."""
    if not url or url.startswith("-") or any(ch in url for ch in "\n\r\x00"):
        raise SourceError(f"git source URL {redact_url(url)!r} is not a repository address")
    if "::" in url.split("://", 1)[0]:
        raise SourceError(f"git source URL {redact_url(url)!r} uses a remote helper; use https, ssh or file URLs")
    if "://" in url:
        scheme = url.split("://", 1)[0].lower()
        if scheme not in URL_SCHEMES:
            raise SourceError(f"git source URL {redact_url(url)!r} has unsupported scheme {scheme!r}")


def validate_branch(branch: str) -> None:
    """A branch name that cannot be mistaken for an option or a refspec (`a:b`, `+x`)."""
    bad = not branch or branch.startswith(("-", "+")) or branch.endswith((".", "/", ".lock"))
    bad = bad or ".." in branch or "@{" in branch or "//" in branch
    bad = bad or any(ch in branch for ch in ":^~?*[\\ \t\n\r\x00\x7f")
    if bad:
        raise SourceError(f"git branch {branch!r} is not a valid branch name")


def _header_scope(url: str) -> str | None:
    """`scheme://host[:port]/`, so the header goes to the repository's server and nowhere else."""
    if "://" not in url:
        return None
    parts = urlsplit(url)
    if parts.scheme.lower() not in {"http", "https"}:
        return None
    return f"{parts.scheme.lower()}://{parts.netloc.rpartition('@')[2].lower()}/"


def scrub(text: str, secrets: list[str]) -> str:
    """Remove secrets (and any `user:pass@` in URLs) from git's messages before anyone sees them."""
    for secret in secrets:
        if secret:
            text = text.replace(secret, "***")
    return _URL_USERINFO.sub(lambda m: f"{m.group('scheme')}***@", text)


@dataclass(frozen=True)
class GitAuth:
    """What git needs to authenticate one https fetch: a Basic header, kept out of argv."""

    header_value: str  # `Basic <base64>`
    scope: str  # `https://host/`
    secrets: tuple[str, ...]  # every form of the secret that must never be shown

    def config(self) -> dict[str, str]:
        return {f"http.{self.scope}.extraHeader": f"Authorization: {self.header_value}"}


def build_auth(url: str, token_env: str | None, environ: Mapping[str, str]) -> tuple[str, GitAuth | None]:
    """The credential-free URL to hand to git, and the header that carries the credential.

    A token from `token_env` goes as `x-access-token:<token>`, which GitHub accepts for personal,
    fine-grained and app tokens and other servers accept as a password.
    """
    clean_url, basic = _split_url_credentials(url)
    secrets: list[str] = []
    if basic is not None:
        secrets += [basic.split(":", 1)[1], url]
    if token_env:
        token = environ.get(token_env, "")
        if not token:
            raise SourceError(f"git source {redact_url(url)}: environment variable {token_env} (token_env) is not set")
        basic = f"x-access-token:{token}"
        secrets.append(token)
    scope = _header_scope(clean_url)
    if basic is None:
        return clean_url, None
    if scope is None:
        log.warning("git source %s: a token is only used for http(s) URLs; ignoring it", redact_url(url))
        return clean_url, None
    encoded = base64.b64encode(basic.encode()).decode()
    return clean_url, GitAuth(f"Basic {encoded}", scope, tuple(secrets + [encoded]))


def git_env(base: Mapping[str, str], extra_config: Mapping[str, str]) -> dict[str, str]:
    """The environment for every git call: never prompt, never wander into another repository.

    Extra configuration is appended after any GIT_CONFIG_COUNT entries the caller already has.
    """
    env = {k: v for k, v in base.items() if k not in _REPO_LOCATING_ENV}
    env["GIT_TERMINAL_PROMPT"] = "0"  # a missing credential must fail, not hang on a prompt
    if "GIT_SSH_COMMAND" not in env and "GIT_SSH" not in env:
        env["GIT_SSH_COMMAND"] = "ssh -o BatchMode=yes"
    count = int(env.get("GIT_CONFIG_COUNT", "0") or "0")
    for key, value in extra_config.items():
        env[f"GIT_CONFIG_KEY_{count}"] = key
        env[f"GIT_CONFIG_VALUE_{count}"] = value
        count += 1
    if count:
        env["GIT_CONFIG_COUNT"] = str(count)
    return env


def fetch_command(git_dir: Path, url: str, branch: str) -> list[str]:
    """`git fetch --depth 1` of one branch (or the remote's HEAD) into FETCHED_REF."""
    return [
        "git", f"--git-dir={git_dir}", "fetch", "--quiet", "--depth", "1", "--no-tags",
        "--no-recurse-submodules", "--no-write-fetch-head", url, f"+{branch}:{FETCHED_REF}",
    ]  # fmt: skip


# --- running git ---------------------------------------------------------------------------------


def _kill_group(process: subprocess.Popen) -> None:
    """Kill git and its helpers (ssh, git-remote-https), which would otherwise hold our pipes open."""
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def run_git(argv: list[str], env: Mapping[str, str], timeout_s: float, secrets: list[str], what: str) -> bytes:
    """Run one git command to completion; any failure becomes a SourceError naming `what`."""
    try:
        process = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            env=dict(env), start_new_session=True,
        )  # fmt: skip
    except OSError as error:
        raise SourceError(f"{what}: cannot run git: {error}") from None
    try:
        stdout, stderr = process.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        _kill_group(process)
        process.communicate()
        raise SourceError(f"{what}: git timed out after {timeout_s:g} s") from None
    if process.returncode != 0:
        lines = [line.strip() for line in stderr.decode("utf-8", "replace").splitlines() if line.strip()]
        message = scrub(" | ".join(lines), secrets) or f"exit status {process.returncode}"  # one line for logs
        raise SourceError(f"{what}: {message}")
    return stdout


class BlobReader:
    """Reads many blobs through one `git cat-file --batch` process.

    Each read has its own deadline (a timer kills the process), so time the caller spends between
    reads, parsing what it got, never counts against git.
    """

    def __init__(self, git_dir: Path, env: Mapping[str, str], timeout_s: float):
        self.timeout_s = timeout_s
        self.process = subprocess.Popen(
            ["git", f"--git-dir={git_dir}", "cat-file", "--batch"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
            env=dict(env), start_new_session=True,
        )  # fmt: skip

    def read(self, sha: str) -> bytes | None:
        """The blob's bytes, or None when the object is missing; SourceError when git died or hung."""
        stdin: IO[bytes] = self.process.stdin  # type: ignore[assignment]
        stdout: IO[bytes] = self.process.stdout  # type: ignore[assignment]
        timer = threading.Timer(self.timeout_s, _kill_group, (self.process,))
        timer.start()
        try:
            stdin.write(sha.encode() + b"\n")
            stdin.flush()
            header = stdout.readline().split()
            if len(header) == 2 and header[1] == b"missing":
                return None
            if len(header) != 3:
                raise SourceError(f"git cat-file stopped answering while reading blob {sha}")
            size = int(header[2])
            data = stdout.read(size)
            stdout.read(1)  # the newline after each object
            if len(data) != size:
                raise SourceError(f"git cat-file returned a truncated blob {sha}")
            return data
        except (OSError, ValueError) as error:
            raise SourceError(f"git cat-file failed while reading blob {sha}: {error}") from None
        finally:
            timer.cancel()

    def close(self) -> None:
        for stream in (self.process.stdin, self.process.stdout):
            try:
                if stream:
                    stream.close()
            except OSError:
                pass
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            _kill_group(self.process)
            self.process.wait()

    def __enter__(self) -> BlobReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# --- the tree ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TreeEntry:
    mode: str
    kind: str  # blob | commit (a submodule)
    sha: str
    size: int | None
    path: str


def parse_ls_tree(output: bytes) -> Iterator[TreeEntry]:
    """Entries of `git ls-tree -r -z --long`: `<mode> <type> <sha> <size>\\t<path>\\0`."""
    for record in output.split(b"\0"):
        if not record:
            continue
        meta, _, raw_path = record.partition(b"\t")
        mode, kind, sha, size = meta.decode("ascii").split()
        # Non-UTF-8 names still get a stable, distinct, printable path.
        path = raw_path.decode("utf-8", "backslashreplace")
        yield TreeEntry(mode, kind, sha, None if size == "-" else int(size), path)


# --- the connector -------------------------------------------------------------------------------


class GitHubConnector:
    """One branch of one git repository; `work_dir` keeps the local repository between syncs."""

    def __init__(
        self,
        source: GitHubSource,
        source_key: str,
        max_bytes: int,
        work_dir: Path,
        timeout_s: float = DEFAULT_TIMEOUT_S,
    ):
        self.source = source
        self.source_key = source_key
        self.max_bytes = max_bytes
        self.work_dir = Path(work_dir)
        self.timeout_s = timeout_s
        self.display_url = redact_url(source.url)

    @property
    def git_dir(self) -> Path:
        return self.work_dir / "repo.git"

    def _what(self, action: str) -> str:
        return f"git {action} of {self.display_url} (branch {self.source.branch})"

    def _ensure_repository(self, env: Mapping[str, str]) -> None:
        """A bare repository with no remote: the URL is given to each fetch, never stored."""
        if (self.git_dir / "HEAD").is_file():
            return
        self.git_dir.mkdir(parents=True, exist_ok=True)
        argv = ["git", "-c", "init.defaultBranch=main", "init", "--quiet", "--bare", str(self.git_dir)]
        run_git(argv, env, self.timeout_s, [], self._what("init"))

    def fetch(self) -> str:
        """Fetch the branch (shallow) and return its commit id; SourceError when that fails."""
        validate_url(self.source.url)
        validate_branch(self.source.branch)
        url, auth = build_auth(self.source.url, self.source.token_env, os.environ)
        secrets = list(auth.secrets) if auth else []
        plain_env = git_env(os.environ, {})
        self._ensure_repository(plain_env)
        fetch_env = git_env(os.environ, auth.config() if auth else {})
        run_git(fetch_command(self.git_dir, url, self.source.branch), fetch_env, self.timeout_s, secrets, self._what("fetch"))
        argv = ["git", f"--git-dir={self.git_dir}", "rev-parse", "--verify", "--quiet", f"{FETCHED_REF}^{{commit}}"]
        commit = run_git(argv, plain_env, self.timeout_s, secrets, self._what("rev-parse")).decode().strip()
        if not commit:
            raise SourceError(f"{self._what('fetch')}: the fetched ref is not a commit")
        return commit

    def _tree(self, commit: str) -> list[TreeEntry]:
        argv = ["git", f"--git-dir={self.git_dir}", "ls-tree", "-r", "-z", "--long", commit]
        output = run_git(argv, git_env(os.environ, {}), self.timeout_s, [], self._what("ls-tree"))
        return list(parse_ls_tree(output))

    def _documents(self, entries: list[TreeEntry]) -> Iterator[TreeEntry]:
        """Included regular files; symlinks (which may point anywhere) and submodules are not documents."""
        for entry in entries:
            if entry.kind != "blob" or entry.mode == SYMLINK_MODE:
                log.debug("git source %s: skipping %s %s (%s)", self.display_url, entry.kind, entry.path, entry.mode)
                continue
            if glob_match(entry.path, self.source.include, self.source.exclude):
                yield entry

    def uri(self, path: str) -> str:
        return f"{self.display_url}@{self.source.branch}:{path}"

    def scan(self, previous: Mapping[str, PreviousItem]) -> Iterator[ScanEvent]:
        commit = self.fetch()
        entries = list(self._documents(self._tree(commit)))
        validators = {"commit": commit}
        reader: BlobReader | None = None
        try:
            for entry in entries:
                uri = self.uri(entry.path)
                known = previous.get(uri)
                if known and known.version == entry.sha:
                    yield Unchanged(uri, entry.sha, validators)
                    continue
                if entry.size is not None and entry.size > self.max_bytes:
                    yield Failed(uri, f"over the size limit ({entry.size} > {self.max_bytes} bytes)", entry.sha)
                    continue
                if reader is None:
                    reader = BlobReader(self.git_dir, git_env(os.environ, {}), self.timeout_s)
                data = reader.read(entry.sha)
                if data is None:
                    yield Failed(uri, f"blob {entry.sha} missing from the fetched commit {commit}", entry.sha)
                    continue
                yield Fetched(
                    uri=uri,
                    version=entry.sha,
                    data=data,
                    name=entry.path,
                    validators=validators,
                    metadata={"path": entry.path, "commit": commit},
                )
        finally:
            if reader is not None:
                reader.close()
