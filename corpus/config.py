"""Customer files: one YAML per customer, validated into typed models.

A customer file is the only thing a new customer needs; every stage reads its settings from
here. Errors name the file, the field and the reason, because the person reading them is
editing YAML, not Python.
"""

from __future__ import annotations

import difflib
import re
from pathlib import Path
from typing import Annotated, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

Domain = Literal["web", "finance", "legal", "email", "code"]
NAME_PATTERN = re.compile(r"^[a-z0-9-]+$")


class CustomerConfigError(ValueError):
    """A customer file that cannot be used, with the file, field and reason in the message."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class LocalSource(_Strict):
    type: Literal["local"]
    path: str
    include: list[str] = Field(default_factory=lambda: ["**/*"])
    exclude: list[str] = Field(default_factory=list)
    name: str | None = None


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


class GitHubSource(_Strict):
    type: Literal["github"]
    url: str
    branch: str = "main"
    token_env: str | None = None
    include: list[str] = Field(default_factory=lambda: ["**/*"])
    exclude: list[str] = Field(default_factory=list)
    name: str | None = None


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


# Top-level sections that later stages read from `CustomerConfig.model_extra` and validate
# with their own models when they run (corpus/ may not import them): the stage that reads each.
STAGE_SECTIONS = {
    "benchmark": "the benchmark_report asset (evaluation settings)",
    "training": "training/customer_training.py (SFT and RL settings)",
    "serving": "serving/deployment.py (promotion gate, vLLM server)",
    "demo_question": "searchsmith demo (the question asked through the service)",
}


def _unknown_key_message(unknown: list[str], known: list[str]) -> str:
    """`limitz` -> "unknown top-level key 'limitz' (did you mean 'limits'?)", one clause per key."""
    parts = []
    for key in unknown:
        close = difflib.get_close_matches(key, known, n=1)
        parts.append(f"{key!r}" + (f" (did you mean {close[0]!r}?)" if close else ""))
    noun = "key" if len(unknown) == 1 else "keys"
    return f"unknown top-level {noun} {', '.join(parts)}; known keys: {', '.join(sorted(known))}"


class CustomerConfig(_Strict):
    # Later stages keep their own sections (STAGE_SECTIONS) in model_extra; any other key is a typo.
    model_config = ConfigDict(extra="allow")

    name: str
    domain: Domain = "web"
    schedule: str = "0 3 * * *"
    sources: list[Source] = Field(min_length=1)
    chunking: ChunkingConfig = Field(default_factory=ChunkingConfig)
    embedding: EmbeddingConfig = Field(default_factory=EmbeddingConfig)
    teacher: TeacherEndpoint | None = None
    tasks: dict = Field(default_factory=dict)  # synth.generate.TaskGenConfig fields, validated by that stage
    limits: CorpusLimits = Field(default_factory=CorpusLimits)
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

    @model_validator(mode="after")
    def _only_known_sections(self) -> "CustomerConfig":
        """A misspelled section (`limitz:`, `chunkng:`) would otherwise be kept silently and its
        settings never applied; name it, with the closest known key."""
        unknown = sorted(set(self.model_extra or {}) - set(STAGE_SECTIONS))
        if unknown:
            known = [name for name in type(self).model_fields if name != "base_dir"] + list(STAGE_SECTIONS)
            raise ValueError(_unknown_key_message(unknown, known))
        return self

    def resolve(self, path: str) -> Path:
        candidate = Path(path).expanduser()
        return candidate if candidate.is_absolute() else (self.base_dir / candidate).resolve()


def _format_errors(path: Path, error: ValidationError) -> str:
    lines = [f"{path}: invalid customer file"]
    for item in error.errors():
        field = ".".join(str(part) for part in item["loc"]) or "(top level)"
        lines.append(f"  - {field}: {item['msg']}")
    return "\n".join(lines)


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
