"""`searchsmith`: the command line. Jobs run in-process against the Dagster instance under
`$SEARCHSMITH_HOME/dagster`, so every CLI run shows in the UI (`make ui`) as well.

`--json` prints exactly one JSON object on stdout; progress and logs go to stderr.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import sys
from pathlib import Path
from typing import Any, Callable

from corpus.config import CustomerConfigError
from corpus.registry import CustomerRegistry, searchsmith_home
from orchestration.errors import CliError


def prepare_environment() -> None:
    home = searchsmith_home()
    os.environ["SEARCHSMITH_HOME"] = str(home)
    dagster_home = Path(os.environ.setdefault("DAGSTER_HOME", str(home / "dagster")))
    dagster_home.mkdir(parents=True, exist_ok=True)
    config = dagster_home / "dagster.yaml"
    if not config.exists():
        config.write_text("telemetry:\n  enabled: false\n")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    os.environ.setdefault("ANONYMIZED_TELEMETRY", "False")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def emit(payload: dict[str, Any], as_json: bool, human: Callable[[dict[str, Any]], str]) -> None:
    if as_json:
        sys.stdout.write(json.dumps(payload, default=str) + "\n")
    else:
        print(human(payload))


# --- commands -----------------------------------------------------------------------------


def cmd_customers_list(args) -> dict[str, Any]:
    customers, problems = CustomerRegistry().scan()
    return {
        "customers": sorted(customers),
        "problems": [{"path": str(p.path), "reason": p.reason} for p in problems],
    }


def cmd_customers_add(args) -> dict[str, Any]:
    from orchestration.runner import register_partition

    config = CustomerRegistry().add(args.file)
    register_partition(config.name)
    customers, _ = CustomerRegistry().scan()
    return {"added": config.name, "customers": sorted(customers)}


def cmd_sync(args) -> dict[str, Any]:
    from orchestration.runner import run_corpus_resync

    return run_corpus_resync(args.customer)


def _human_customers(payload: dict[str, Any]) -> str:
    lines = [f"added {payload['added']}"] if payload.get("added") else []
    lines += payload["customers"] or ["(no customers)"]
    lines += [f"warning: {p['path']}: {p['reason']}" for p in payload.get("problems", [])]
    return "\n".join(lines)


def _human_sync(payload: dict[str, Any]) -> str:
    keys = ("added", "changed", "deleted", "unchanged", "quarantined", "chunks")
    return f"{payload['customer']}: " + ", ".join(f"{k} {payload[k]}" for k in keys)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="searchsmith", description=__doc__.split("\n")[0])
    parser.add_argument("--verbose", "-v", action="store_true", help="debug logging on stderr")
    sub = parser.add_subparsers(dest="command", required=True)

    def add(name: str, func, human, help_text: str, parent=sub):
        command = parent.add_parser(name, help=help_text)
        command.add_argument("--json", action="store_true", help="print one JSON object on stdout")
        command.set_defaults(func=func, human=human)
        return command

    customers = sub.add_parser("customers", help="register and list customers").add_subparsers(dest="action", required=True)
    add("list", cmd_customers_list, _human_customers, "list customers", customers)
    add("add", cmd_customers_add, _human_customers, "register a customer file", customers).add_argument("file")
    add("sync", cmd_sync, _human_sync, "incremental resync of a customer's sources").add_argument("customer")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.WARNING, stream=sys.stderr, format="%(levelname)s %(name)s: %(message)s")
    prepare_environment()
    try:
        # Libraries that print progress to stdout must not corrupt the one JSON object.
        with contextlib.redirect_stdout(sys.stderr):
            payload = args.func(args)
    except (CliError, CustomerConfigError, FileNotFoundError) as error:
        if getattr(args, "json", False):
            sys.stdout.write(json.dumps({"error": str(error)}) + "\n")
        else:
            print(f"error: {error}", file=sys.stderr)
        return 1
    emit(payload, getattr(args, "json", False), args.human)
    return 0


if __name__ == "__main__":
    sys.exit(main())
