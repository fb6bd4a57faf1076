"""Customer files: one YAML per customer, validated whole into typed models.

A customer file is the only thing a new customer needs; every stage reads its settings from
here. Errors name the file, the field and the reason, because the person reading them is
editing YAML, not Python.
"""

from __future__ import annotations

import difflib
import re
from pathlib import Path
from types import UnionType
from typing import Annotated, Any, Literal, Union, get_args, get_origin
from urllib.parse import urlsplit

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from core.benchmark_settings import BenchmarkSettings
from core.serving_settings import ServingSettings
from core.task_settings import Domain, TaskGenConfig
from core.training_settings import TrainingSettings

NAME_PATTERN = re.compile(r"^[a-z0-9-]+$")


class CustomerConfigError(ValueError):
    """A customer file that cannot be used, with the file, field and reason in the message."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


def _not_blank(value: str) -> str:
    if not value.strip():
        raise ValueError("must not be empty")
    return value


class LocalSource(_Strict):
    type: Literal["local"]
    path: str
    include: list[str] = Field(default_factory=lambda: ["**/*"])
    exclude: list[str] = Field(default_factory=list)
    name: str | None = None

    _path_given = field_validator("path")(_not_blank)


class S3Source(_Strict):
    type: Literal["s3"]
    bucket: str
    prefix: str = ""
    endpoint_url: str | None = None
    region: str | None = None
    include: list[str] = Field(default_factory=lambda: ["**/*"])
    exclude: list[str] = Field(default_factory=list)
    access_key_env: str | None = None
    secret_key_env: str | None = None
    name: str | None = None
    # An endpoint that accepts and never answers costs at most about
    # max_attempts * (connect_timeout_s + read_timeout_s) per request before the source fails.
    connect_timeout_s: float = Field(5.0, gt=0)
    read_timeout_s: float = Field(20.0, gt=0)
    max_attempts: int = Field(3, ge=1, le=10)

    @field_validator("bucket")
    @classmethod
    def _bucket_is_a_name(cls, value: str) -> str:
        """A bucket is a bare name: `docs/2024` or `s3://docs` would fail only at the first sync,
        as a missing bucket."""
        if not value.strip() or any(ch.isspace() for ch in value) or "/" in value or ":" in value:
            raise ValueError(f"{value!r} is not a bucket name (no spaces, '/' or ':'); put a folder in `prefix`, "
                             "an address in `endpoint_url`")
        return value


class GitHubSource(_Strict):
    type: Literal["github"]
    url: str
    branch: str = "main"
    token_env: str | None = None
    include: list[str] = Field(default_factory=lambda: ["**/*"])
    exclude: list[str] = Field(default_factory=list)
    name: str | None = None

    _url_given = field_validator("url", "branch")(_not_blank)


class WebSource(_Strict):
    type: Literal["web"]
    seeds: list[str] = Field(min_length=1)
    allow_hosts: list[str] = Field(default_factory=list)
    max_pages: int = Field(default=500, ge=1)
    max_depth: int = Field(default=5, ge=0)
    rate_limit_per_s: float = Field(default=2.0, gt=0)
    allow_private: bool = False
    use_sitemap: bool = True
    user_agent: str = "SearchsmithBot/0.1"
    name: str | None = None

    @field_validator("seeds")
    @classmethod
    def _seeds_are_web_addresses(cls, value: list[str]) -> list[str]:
        """The crawler only follows http(s) pages on its seeds' hosts: a seed without a scheme or
        host would give an empty scope, and an empty sync rather than an error."""
        for seed in value:
            parts = urlsplit(seed)
            if parts.scheme not in ("http", "https") or not parts.hostname:
                raise ValueError(f"seed {seed!r} is not an http(s) address with a host, e.g. https://example.com/docs/")
        return value


Source = Annotated[LocalSource | S3Source | GitHubSource | WebSource, Field(discriminator="type")]


class ChunkingConfig(_Strict):
    """`size_tokens` None means the embedding model's own window, so dense vectors see whole chunks."""

    size_tokens: int | None = Field(default=None, ge=16)
    overlap_tokens: int = Field(default=32, ge=0)
    max_bytes: int = Field(default=16_384, ge=256)


class EmbeddingConfig(_Strict):
    """Default: the packaged all-MiniLM-L6-v2 (offline). `model` may be a sentence-transformers
    folder, or a model name at an OpenAI-compatible embeddings endpoint when `base_url` is set."""

    model: str | None = None
    base_url: str | None = None
    api_key_env: str = "OPENAI_API_KEY"
    batch_size: int | None = Field(default=None, ge=1)


class TeacherEndpoint(_Strict):
    """Any OpenAI-compatible chat endpoint (task generation, distillation). The key is read from
    the environment variable named by `api_key_env`; never put the key itself here."""

    base_url: str
    model: str
    api_key_env: str | None = None
    timeout_s: float = Field(default=120.0, gt=0)
    max_retries: int = Field(default=4, ge=0)
    concurrency: int = Field(default=4, ge=1)


class CorpusLimits(_Strict):
    max_document_bytes: int = Field(default=20_000_000, ge=1)
    resync_retrain_share: float = Field(default=0.2, ge=0, le=1)


class CustomerConfig(_Strict):
    """The whole customer file. Every section is typed here, so a misspelled key anywhere is an
    error naming its path when the file is loaded, not hours later when a stage reads it (or
    never, for a key a stage would have ignored)."""

    name: str
    domain: Domain = "web"
    schedule: str = "0 3 * * *"
    sources: list[Source] = Field(min_length=1)
    chunking: ChunkingConfig = Field(default_factory=ChunkingConfig)
    embedding: EmbeddingConfig = Field(default_factory=EmbeddingConfig)
    teacher: TeacherEndpoint | None = None
    tasks: TaskGenConfig = Field(default_factory=TaskGenConfig)  # its `domain` defaults to the file's
    limits: CorpusLimits = Field(default_factory=CorpusLimits)
    benchmark: BenchmarkSettings = Field(default_factory=BenchmarkSettings)
    training: TrainingSettings = Field(default_factory=TrainingSettings)
    serving: ServingSettings = Field(default_factory=ServingSettings)
    demo_question: str | None = None  # what `searchsmith demo` asks through the search service
    # Folder that relative paths resolve against: the customer file's folder.
    base_dir: Path = Field(default=Path("."), exclude=True)

    @field_validator("name")
    @classmethod
    def _name_is_partition_key(cls, value: str) -> str:
        if not NAME_PATTERN.match(value):
            raise ValueError("must match [a-z0-9-]+ (it is the Dagster partition key)")
        return value

    @field_validator("schedule")
    @classmethod
    def _schedule_is_cron(cls, value: str) -> str:
        if len(value.split()) != 5:
            raise ValueError("must be a five-field cron expression, e.g. '0 3 * * *'")
        return value

    @model_validator(mode="before")
    @classmethod
    def _tasks_domain_is_the_files(cls, data: Any) -> Any:
        """`tasks.domain` is the file's `domain` unless the section sets its own."""
        if isinstance(data, dict) and "domain" in data and isinstance(data.get("tasks"), dict | None):
            tasks = data.get("tasks") or {}
            if "domain" not in tasks:
                data = {**data, "tasks": {**tasks, "domain": data["domain"]}}
        return data

    @field_validator("tasks", "benchmark", "training", "serving", mode="before")
    @classmethod
    def _empty_section_is_defaults(cls, value: Any) -> Any:
        """`training:` with nothing under it means the section's defaults."""
        return {} if value is None else value

    def resolve(self, path: str) -> Path:
        candidate = Path(path).expanduser()
        return candidate if candidate.is_absolute() else (self.base_dir / candidate).resolve()


def _fields_at(model: Any, loc: tuple) -> list[str]:
    """The keys allowed where `loc` points, walking nested models, lists and tagged unions (for a
    "did you mean"); empty when the place is not a model."""
    candidates = [model]
    for part in loc:
        following = []
        for annotation in candidates:
            for option in _options(annotation):
                if isinstance(part, int) and get_origin(option) is list:
                    following.extend(get_args(option)[:1])
                elif isinstance(option, type) and issubclass(option, BaseModel):
                    if part in option.model_fields:
                        following.append(option.model_fields[part].annotation)
                    elif _tag(option) == part:  # a discriminated union's member, named by its tag
                        following.append(option)
        candidates = following
    names = [name for c in candidates for o in _options(c) if isinstance(o, type) and issubclass(o, BaseModel) for name in o.model_fields]
    return [name for name in dict.fromkeys(names) if name != "base_dir"]


def _options(annotation: Any) -> list[Any]:
    """The types an annotation admits: Annotated and unions unwrapped."""
    if get_origin(annotation) is Annotated:
        return _options(get_args(annotation)[0])
    if get_origin(annotation) in (Union, UnionType):
        return [o for arg in get_args(annotation) for o in _options(arg)]
    return [annotation]


def _tag(model: type[BaseModel]) -> str | None:
    field = model.model_fields.get("type")
    values = get_args(field.annotation) if field is not None and get_origin(field.annotation) is Literal else ()
    return values[0] if len(values) == 1 else None


def _error_line(item: dict[str, Any]) -> str:
    loc = item["loc"]
    where = ".".join(str(part) for part in loc)
    if item["type"] == "extra_forbidden":
        close = difflib.get_close_matches(str(loc[-1]), _fields_at(CustomerConfig, loc[:-1]), n=1)
        meant = f" (did you mean {close[0]!r}?)" if close else ""
        return f"unknown top-level key {loc[0]!r}{meant}" if len(loc) == 1 else f"{where}: unknown key{meant}"
    message = item["msg"].removeprefix("Value error, ")
    return f"{where or '(top level)'}: {message}"


def _format_errors(path: Path, error: ValidationError) -> str:
    return "\n".join([f"{path}: invalid customer file", *(f"  - {_error_line(item)}" for item in error.errors(include_url=False))])


def parse_customer(data: object, path: Path) -> CustomerConfig:
    if not isinstance(data, dict):
        raise CustomerConfigError(f"{path}: expected a YAML mapping at the top level")
    try:
        config = CustomerConfig.model_validate(data)
    except ValidationError as error:
        raise CustomerConfigError(_format_errors(path, error)) from None
    config.base_dir = path.resolve().parent
    return config


def read_customer_text(path: Path) -> str:
    """The file's text, or a CustomerConfigError naming the file: whatever sits in `customers/`
    (a folder called x.yaml, a Latin-1 file, an unreadable file) is one bad entry, never a crash
    of every command that lists customers."""
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise CustomerConfigError(f"{path}: customer file not found") from None
    except IsADirectoryError:
        raise CustomerConfigError(f"{path}: is a folder, not a customer file") from None
    except UnicodeDecodeError as error:
        raise CustomerConfigError(f"{path}: not UTF-8 text (byte {error.object[error.start]:#04x} at offset {error.start})") from None
    except OSError as error:
        raise CustomerConfigError(f"{path}: cannot be read: {error.strerror or error}") from None


def load_customer(path: str | Path) -> CustomerConfig:
    path = Path(path)
    text = read_customer_text(path)
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as error:
        raise CustomerConfigError(f"{path}: not valid YAML: {error}") from None
    return parse_customer(data, path)
