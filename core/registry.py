"""Where customer files are found: the `customers/` folder plus files registered by `customers add`.

Registered files are remembered by absolute path (not copied), so relative source paths keep
resolving against the folder the customer file lives in. Each file is validated whole when it
is loaded (`core.config`), and a file that fails is an invalid entry, never the end of every
other customer.
"""

from __future__ import annotations

import json
import os
import threading
from dataclasses import dataclass
from pathlib import Path

import yaml

from core.config import CustomerConfig, CustomerConfigError, load_customer

REPO_ROOT = Path(__file__).resolve().parents[1]


def searchsmith_home() -> Path:
    return Path(os.environ.get("SEARCHSMITH_HOME", "./.searchsmith")).expanduser().resolve()


def customers_dir() -> Path:
    configured = os.environ.get("SEARCHSMITH_CUSTOMERS_DIR")
    if configured:
        return Path(configured).expanduser().resolve()
    local = Path.cwd() / "customers"
    return local.resolve() if local.is_dir() else REPO_ROOT / "customers"


@dataclass(frozen=True)
class RegistryProblem:
    path: Path
    reason: str


class CustomerRegistry:
    def __init__(self, home: Path | None = None, folder: Path | None = None):
        self.home = home or searchsmith_home()
        self.folder = folder or customers_dir()
        self.index_path = self.home / "customers.json"

    def load(self, path: Path) -> CustomerConfig:
        """One customer file, validated whole."""
        return load_customer(path)

    def _registered(self) -> dict[str, str]:
        if not self.index_path.exists():
            return {}
        try:
            registered = json.loads(self.index_path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as error:
            raise CustomerConfigError(f"{self.index_path}: registered customers cannot be read: {error}") from None
        if not isinstance(registered, dict):
            raise CustomerConfigError(f"{self.index_path}: expected a JSON object of name -> customer file")
        return registered

    def _registered_files(self, problems: list[RegistryProblem]) -> list[Path]:
        """Files added with `customers add`; an unreadable index is one problem, not a crash."""
        try:
            return [Path(p) for p in self._registered().values()]
        except CustomerConfigError as error:
            problems.append(RegistryProblem(self.index_path, str(error)))
            return []

    def _candidate_files(self, problems: list[RegistryProblem]) -> list[Path]:
        files = sorted(self.folder.glob("*.yaml")) + sorted(self.folder.glob("*.yml")) if self.folder.is_dir() else []
        return files + self._registered_files(problems)

    def scan(self) -> tuple[dict[str, CustomerConfig], list[RegistryProblem]]:
        """All valid customers by name, and every file that could not be used (never dropped
        silently). One bad entry never hides the others: every CLI command and the search
        service find their customers through here."""
        found: dict[str, CustomerConfig] = {}
        problems: list[RegistryProblem] = []
        for path in self._candidate_files(problems):
            try:
                config = self.load(path)
            except CustomerConfigError as error:
                problems.append(RegistryProblem(path, str(error)))
                continue
            if config.name in found and found[config.name].base_dir != config.base_dir:
                problems.append(RegistryProblem(path, f"customer name {config.name!r} is already defined elsewhere"))
                continue
            found.setdefault(config.name, config)
        return found, problems

    def customers(self) -> dict[str, CustomerConfig]:
        return self.scan()[0]

    def get(self, name: str) -> CustomerConfig:
        customers, problems = self.scan()
        if name in customers:
            return customers[name]
        hint = "; ".join(p.reason for p in problems)
        known = ", ".join(sorted(customers)) or "none"
        raise CustomerConfigError(f"unknown customer {name!r} (known: {known})" + (f"; unusable files: {hint}" if hint else ""))

    def add(self, path: str | Path) -> CustomerConfig:
        path = Path(path).resolve()
        config = self.load(path)
        registered = self._registered()
        existing = registered.get(config.name)
        if existing and Path(existing) != path and Path(existing).exists():
            raise CustomerConfigError(f"{path}: customer {config.name!r} is already registered from {existing}")
        registered[config.name] = str(path)
        self._write(registered)
        return config

    def remove(self, target: str) -> tuple[str, Path]:
        """Forget a file `customers add` registered, by customer name or by the file's path (a
        file that no longer validates has no name to give). The file, the customer's artifacts and
        its run history stay; a file in the customers folder is not registered and is refused."""
        registered = self._registered()
        candidate = Path(target).expanduser().resolve()
        for name, file in registered.items():
            if name == target or Path(file) == candidate:
                del registered[name]
                self._write(registered)
                return name, Path(file)
        in_folder = [path for path in self._candidate_files([]) if path.parent == self.folder]
        for path in in_folder:
            if path.resolve() == candidate or _name_in(path) == target:
                raise CustomerConfigError(f"{path} is in the customers folder, not registered: move or delete the file "
                                          "to remove the customer")
        known = ", ".join(f"{name} ({file})" for name, file in sorted(registered.items())) or "none"
        raise CustomerConfigError(f"no registered customer or file {target!r} (registered: {known})")

    def _write(self, registered: dict[str, str]) -> None:
        self.index_path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.index_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(registered, indent=2, sort_keys=True))
        tmp.replace(self.index_path)


def _name_in(path: Path) -> str | None:
    """The customer name a file declares, if it can be read at all (an invalid file may still name one)."""
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, yaml.YAMLError):
        return None
    return data.get("name") if isinstance(data, dict) else None


class KnownCustomers:
    """The names of the valid customers, re-read only when a customer file or the registered
    index changed (their names, sizes and modification times): a long-running service asks on
    every request, and a stat per file costs far less than loading and validating every file."""

    def __init__(self, registry: CustomerRegistry | None = None):
        self.registry = registry or CustomerRegistry()
        self._lock = threading.Lock()
        self._cached: tuple[tuple, frozenset[str]] | None = None

    def _signature(self) -> tuple:
        problems: list[RegistryProblem] = []
        paths = self.registry._candidate_files(problems) + [self.registry.index_path]
        signature = []
        for path in paths:
            try:
                info = path.stat()
            except OSError:
                signature.append((str(path), None))
                continue
            signature.append((str(path), info.st_ino, info.st_size, info.st_mtime_ns))
        return tuple(signature)

    def names(self) -> frozenset[str]:
        signature = self._signature()
        with self._lock:
            if self._cached is None or self._cached[0] != signature:
                self._cached = (signature, frozenset(self.registry.customers()))
            return self._cached[1]
