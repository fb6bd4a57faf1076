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

from core.config import CustomerConfigError
from core.registry import CustomerRegistry, searchsmith_home
from corpus.sources.base import printable_name
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
    """Valid customers by name; every file that cannot be used is listed as invalid, with why."""
    customers, problems = CustomerRegistry().scan()
    return {
        "customers": sorted(customers),
        "invalid": [printable_name(str(p.path)) for p in problems],
        "problems": [{"path": printable_name(str(p.path)), "reason": printable_name(p.reason)} for p in problems],
    }


def cmd_customers_add(args) -> dict[str, Any]:
    from orchestration.runner import register_partition

    config = CustomerRegistry().add(args.file)
    register_partition(config.name)
    customers, _ = CustomerRegistry().scan()
    return {"added": config.name, "customers": sorted(customers)}


def cmd_customers_remove(args) -> dict[str, Any]:
    name, path = CustomerRegistry().remove(args.customer)
    return {"removed": name, "file": printable_name(str(path)), **cmd_customers_list(args)}


def cmd_sync(args) -> dict[str, Any]:
    from orchestration.runner import run_corpus_resync

    return run_corpus_resync(args.customer)


def cmd_search(args) -> dict[str, Any]:
    from orchestration.runner import search

    payload = search(args.customer, args.question, args.policy, args.k, args.parallel, save=args.save)
    if args.save:
        print(f"trajectory saved to {payload['saved']} (open it in the search service's page, GET /)", file=sys.stderr)
    return payload


def _human_search(payload: dict[str, Any]) -> str:
    lines = [] if payload["documents"] else ["no documents found"]  # an empty corpus, or nothing matched
    for rank, doc in enumerate(payload["documents"], start=1):
        lines.append(f"{rank:>2}. {doc['title']}  [{doc['doc_id']}]")
        if doc.get("justification"):
            lines.append(f"    {doc['justification']}")
    s = payload["summary"]
    lines.append(f"-- turns {s['turns']}, tool calls {s['tool_calls']}, peak tokens {s['peak_tokens']}, pruned {s['pruned']}")
    return "\n".join(lines)


def cmd_tasks(args) -> dict[str, Any]:
    from orchestration.runner import run_tasks

    return run_tasks(args.customer)


def _human_tasks(payload: dict[str, Any]) -> str:
    failed = ", ".join(f"{k} {v}" for k, v in payload["failed"].items()) or "none"
    return (
        f"{payload['customer']}: generated {payload['generated']}, verified {payload['verified']}, distractors {payload['distractors']}\n"
        f"  by split: {payload['by_split']}\n  by hops: {payload['by_hops']}\n  failed: {failed}"
    )


def cmd_bench(args) -> dict[str, Any]:
    from evaluation.bench import run_bench_command

    policies = [p.strip() for p in args.policies.split(",") if p.strip()]
    if not policies:
        raise CliError("--policies needs at least one policy, e.g. bm25,dense,hybrid,heuristic")
    backend = chunks = None
    if args.customer:
        from orchestration.runner import open_index

        backend, chunks = open_index(args.customer)
    return run_bench_command(
        args.tasks, policies, args.k, args.out, args.limit, progress=_live(args), backend=backend, chunks=chunks, split=args.split,
        workers=args.workers, reranker=args.reranker,
    )


def _human_bench(payload: dict[str, Any]) -> str:
    lines = [f"{'policy':<24} {'answer':>7} {'recall':>7} {'prec':>6} {'f1':>6} {'traj_r':>7} {'prune':>6} {'tokens':>8} {'n':>5}"]
    for name, m in payload["policies"].items():
        prune = "-" if m.get("prune_accuracy") is None else f"{m['prune_accuracy']:.3f}"
        lines.append(
            f"{name:<24} {m['answer_found']:>7.3f} {m['recall']:>7.3f} {m['precision']:>6.3f} {m['f1']:>6.3f} "
            f"{m['trajectory_recall']:>7.3f} {prune:>6} {m['mean_prompt_tokens']:>8.0f} {m['n']:>5}"
        )
    return "\n".join(lines)


def cmd_finetune(args) -> dict[str, Any]:
    from orchestration.runner import run_finetune

    return run_finetune(args.customer, args.stage)


def _selection_line(selection: dict[str, Any]) -> str:
    """How `+rerank` candidates will select, per kind of candidate (training.selection_weight)."""
    choices = selection.get("by_policy") or ({"every policy": selection} if "policy_weight" in selection else {})
    if not choices:
        return ""
    how = {policy: f"{policy} weight {choice['policy_weight']:g}, "
           + (f"chains from {choice['chain_anchors']} first links" if choice.get("chain_anchors") else "judged by the question")
           for policy, choice in choices.items()}
    return f"  selection (chosen on the dev split): {'; '.join(how.values())}\n"


def _human_finetune(payload: dict[str, Any]) -> str:
    if payload["stage"] == "reranker":
        dev = payload["dev"]
        reused = " (reused: nothing changed)" if payload.get("reused") else ""
        rows = "\n".join(f"  {row:<8} recall@k {f['recall_at_k']:.3f}  mrr {f['mrr']:.3f}" for row, f in dev.items())
        return (f"{payload['customer']} reranker: {payload['path']}{reused}\n  {payload['train'].get('pairs')} training pairs, "
                f"{payload['train'].get('pairs_per_s')} pairs/s; dev split ({dev['trained'].get('tasks')} tasks, hybrid's top documents reordered):\n"
                f"{rows}\n{_selection_line(payload.get('selection') or {})}  benchmark with: searchsmith bench --tasks FILE --policies hybrid,hybrid+rerank,heuristic+rerank --reranker {payload['path']} --out DIR")
    metrics = ", ".join(f"{k} {v:.4g}" for k, v in payload["metrics"].items() if isinstance(v, (int, float)) and not isinstance(v, bool))
    reused = " (reused: nothing changed)" if payload.get("reused") else ""
    return (f"{payload['customer']} {payload['stage']}: adapter {payload['adapter_path']}{reused}\n"
            f"  base model {payload['base_model']}, {payload['steps']} steps\n  {metrics}\n"
            f"  search with: searchsmith search {payload['customer']} \"...\" --policy {payload['policy']}")


def cmd_serve(args) -> dict[str, Any]:
    from orchestration.runner import run_serve

    return run_serve(args.customer, args.rollback)


def _human_serve(payload: dict[str, Any]) -> str:
    served = payload["served"]
    verdict = "promoted" if payload["promoted"] else ("rolled back" if payload.get("action") == "rollback" else "not promoted")
    lines = [f"{payload['customer']}: {verdict}: {payload['reason']}", f"  served: {served['policy']}"]
    test = (served.get("metrics") or {}).get("test") or {}
    if test:
        lines.append("  test split: " + ", ".join(f"{k} {v:.3f}" for k, v in test.items() if k in ("answer_found", "recall")))
    if payload.get("serving") and payload["serving"].get("server_url"):
        lines.append(f"  on {payload['serving']['server_url']} as {payload['serving']['adapter_name']}")
    return "\n".join(lines)


def cmd_keys_create(args) -> dict[str, Any]:
    from orchestration.runner import create_api_key

    return create_api_key(args.customer)


def _human_key(payload: dict[str, Any]) -> str:
    return f"{payload['key']}\n(API key for {payload['customer']}; shown once: only a salted hash is stored)"


def cmd_keys_list(args) -> dict[str, Any]:
    from orchestration.runner import list_api_keys

    return list_api_keys(args.customer)


def _human_keys(payload: dict[str, Any]) -> str:
    lines = [f"{key['key_id']}  created {key['created_at']}" for key in payload["keys"]]
    return "\n".join(lines) or f"(no API keys for {payload['customer']})"


def cmd_keys_revoke(args) -> dict[str, Any]:
    from orchestration.runner import revoke_api_key

    return revoke_api_key(args.key_id)


def _human_revoked(payload: dict[str, Any]) -> str:
    return f"revoked {payload['revoked']} ({payload['customer']}); a running search service refuses it from now on"


def cmd_api(args) -> dict[str, Any]:
    """The search service, wired from the environment: it runs without Dagster or torch installed."""
    from serving.service_wiring import api_limits, serve_search_api

    try:
        limits = api_limits(args.timeout, args.workers, args.queue)
    except ValueError as error:
        raise CliError(str(error)) from None
    print(f"search service on http://{args.host}:{args.port} (POST /v1/search, GET /openapi.json); "
          f"{args.workers} workers, queue {args.queue}", file=sys.stderr)
    serve_search_api(args.host, args.port, limits)
    return {"stopped": True}


def cmd_status(args) -> dict[str, Any]:
    from orchestration.status import customer_status

    return customer_status(args.customer)


def _human_status(payload: dict[str, Any]) -> str:
    from orchestration.status import render_status

    return render_status(payload)


def cmd_demo(args) -> dict[str, Any]:
    """The whole lineage for the offline demo customer (through the promotion gate), then one
    question through the real search service with the served policy."""
    from orchestration.runner import check_search_api, register_partition, run_job

    config = CustomerRegistry().get("demo")
    # The question lives in the customer file, which the demo's own-repository source does not
    # index, so the answer cannot come from the code that asks it.
    question = config.demo_question or "What did the Royal Engineers play in 1872?"
    print("materializing the lineage for customer 'demo' (offline stand-ins: see customers/demo.yaml)", file=sys.stderr)
    register_partition("demo")
    metadata = run_job("customer_lineage", "demo")
    served = metadata.get("served_model", {})
    answer = check_search_api("demo", question)
    return {
        "customer": "demo", "materialized": sorted(metadata),
        "served": {"promoted": bool(served.get("promoted")), "reason": served.get("reason", ""), "policy": served.get("served_policy"),
                   "gate": served.get("decision") or ""},
        "search": {"question": question, "via": "POST /v1/search", **answer},
    }


def _human_demo(payload: dict[str, Any]) -> str:
    """Ends with the gate's table and the answer (each step already printed its own line)."""
    served = payload["served"]
    lines = [
        "next: `searchsmith status demo`; `searchsmith keys create demo` and `searchsmith api --port 8080`, then open "
        "http://127.0.0.1:8080/ (the trajectory viewer) or POST /v1/search with the key",
        f"gate: {'promoted' if served['promoted'] else 'not promoted'}: {served['reason']}",
        *([served["gate"]] if served.get("gate") else []),
        f"search service ({payload['search']['via']}, policy {payload['search']['policy']}): {payload['search']['question']}",
        _human_search(payload["search"]),
    ]
    return "\n".join(lines)


def _human_customers(payload: dict[str, Any]) -> str:
    lines = [f"added {payload['added']}"] if payload.get("added") else []
    if payload.get("removed"):
        lines = [f"removed {payload['removed']} (registered from {payload['file']}; the file and the customer's artifacts stay)"]
    lines += payload["customers"] or ["(no customers)"]
    lines += [_invalid_line(problem) for problem in payload.get("problems", [])]
    return "\n".join(lines)


def _invalid_line(problem: dict[str, str]) -> str:
    """`invalid: PATH: REASON` (most reasons already start with the path)."""
    reason = problem["reason"]
    return f"invalid: {reason}" if reason.startswith(problem["path"]) else f"invalid: {problem['path']}: {reason}"


def _human_sync(payload: dict[str, Any]) -> str:
    keys = ("added", "changed", "deleted", "unchanged", "quarantined", "chunks")
    lines = [f"{payload['customer']}: " + ", ".join(f"{k} {payload[k]}" for k in keys)]
    for status in payload.get("sources", []):
        if status["status"] == "ok":
            counts = ", ".join(f"{k} {status[k]}" for k in keys if k in status)
            lines.append(f"  ok      {status['source']}: {counts}")
        else:
            lines.append(f"  FAILED  {status['source']}: {status.get('reason', '')} (its documents were kept as they were)")
    return "\n".join(lines)


def _sync_exit_code(payload: dict[str, Any]) -> int:
    """1 when a whole source could not be listed, though the others were synced."""
    return 1 if payload.get("failed_sources") else 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="searchsmith", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--verbose", "-v", action="store_true", help="debug logging on stderr")
    sub = parser.add_subparsers(dest="command", required=True)

    def add(name: str, func, human, help_text: str, parent=sub):
        command = parent.add_parser(name, help=help_text, description=help_text[:1].upper() + help_text[1:] + ".")
        command.add_argument("--json", action="store_true", help="print one JSON object on stdout")
        command.set_defaults(func=func, human=human)
        return command

    customers = sub.add_parser("customers", help="register, list and remove customers", description="Register, list and remove customers.").add_subparsers(dest="action", required=True)
    add("list", cmd_customers_list, _human_customers, "list customers", customers)
    add("add", cmd_customers_add, _human_customers, "register a customer file", customers).add_argument("file")
    add("remove", cmd_customers_remove, _human_customers, "forget a customer file registered with add (by name, or by path when "
        "the file no longer validates); the file and the customer's artifacts stay", customers).add_argument("customer", metavar="NAME_OR_FILE")
    sync = add("sync", cmd_sync, _human_sync, "incremental resync of a customer's sources (exit 1 if a source could not be listed)")
    sync.add_argument("customer")
    sync.set_defaults(exit_code=_sync_exit_code)
    add("tasks", cmd_tasks, _human_tasks, "generate, verify and split synthetic search tasks").add_argument("customer")
    bench = add("bench", cmd_bench, _human_bench, "benchmark policies on a task file; writes report.json, report.md and plots")
    bench.add_argument("--tasks", required=True, help="external benchmark JSONL (question/answer/paragraphs) or synthetic tasks JSONL")
    bench.add_argument("--policies", default="bm25,dense,hybrid,heuristic", help="comma-separated: bm25, dense, hybrid, heuristic, openai:URL#MODEL, transformers:PATH, POLICY@N, POLICY+rerank")
    bench.add_argument("--k", type=int, default=5, help="documents every candidate returns")
    bench.add_argument("--out", required=True, help="output folder")
    bench.add_argument("--limit", type=int, default=None, help="first N questions only")
    bench.add_argument("--customer", default=None, help="for synthetic task files: the customer whose index to search")
    bench.add_argument("--split", default="test", help="for synthetic task files: which split (default test)")
    bench.add_argument("--workers", type=int, default=None, help="questions run concurrently")
    bench.add_argument("--reranker", default=None, help="reranker folder (bi- or cross-encoder) for +rerank candidates (a customer's reranker_checkpoint)")
    finetune = add("finetune", cmd_finetune, _human_finetune, "distil (SFT) and/or reinforce (CISPO) a LoRA adapter for a customer")
    finetune.add_argument("customer")
    finetune.add_argument("--stage", choices=["sft", "rl", "all", "reranker"], default="all",
                          help="sft, rl (CISPO from the SFT adapter), all (both), or reranker (selection's judge)")
    serve = add("serve", cmd_serve, _human_serve, "promote the best benchmarked checkpoint through the regression gate")
    serve.add_argument("customer")
    serve.add_argument("--rollback", action="store_true", help="restore the previously served policy")
    keys = sub.add_parser("keys", help="API keys of the search service", description="API keys of the search service.").add_subparsers(dest="action", required=True)
    add("create", cmd_keys_create, _human_key, "create an API key for a customer (shown once)", keys).add_argument("customer")
    add("list", cmd_keys_list, _human_keys, "list a customer's API key ids and creation times (never secrets)", keys).add_argument("customer")
    add("revoke", cmd_keys_revoke, _human_revoked, "revoke an API key by its id", keys).add_argument("key_id", metavar="ID")
    api = add("api", cmd_api, lambda payload: "search service stopped", "run the HTTP search service (POST /v1/search)")
    api.add_argument("--host", default="127.0.0.1")
    api.add_argument("--port", type=int, default=8080)
    api.add_argument("--timeout", type=float, default=60.0, help="seconds one search may take (a model on CPU needs more)")
    api.add_argument("--workers", type=int, default=4, help="searches that run at once")
    api.add_argument("--queue", type=int, default=64, help="requests that may wait for a worker; beyond that, 503 with Retry-After")
    add("demo", cmd_demo, _human_demo, "materialize the whole lineage for the offline demo customer")
    search = add("search", cmd_search, _human_search, "ask a customer's search agent a question")
    search.add_argument("customer")
    search.add_argument("question")
    search.add_argument("--policy", default="heuristic", help="heuristic | openai:URL#MODEL | transformers:PATH, each optionally +rerank "
                        "(selection with the customer's reranker) (default: heuristic)")
    search.add_argument("--k", type=int, default=10, help="documents to return")
    search.add_argument("--parallel", type=int, default=1, help="N independent rollouts merged by RRF")
    search.add_argument("--save", default=None, metavar="FILE", help="write the whole trajectory (JSONL, one line per rollout) for the viewer")
    status = add("status", cmd_status, _human_status, "where a customer stands: assets, checks, served policy, next resync")
    status.add_argument("customer")
    for command in (sync, bench, finetune, serve, search, sub.choices["tasks"], sub.choices["demo"]):
        command.set_defaults(session=True)  # runs jobs or loads models: events and library logs to a log file
    return parser


def _live(args) -> bool:
    """Bars and status lines only for a person at a terminal: never with --json or into a pipe."""
    return sys.stderr.isatty() and not getattr(args, "json", False)


def _session(args):
    """Commands that run jobs: events to `$SEARCHSMITH_HOME/logs/` (module `orchestration.console`)."""
    if not getattr(args, "session", False):
        return contextlib.nullcontext()
    from orchestration.console import console_session

    if not args.verbose:  # model loading and dataset saving bars are not progress a person waits on
        os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
        os.environ.setdefault("HF_DATASETS_DISABLE_PROGRESS_BARS", "1")
    return console_session(searchsmith_home(), args.command, verbose=args.verbose, live=_live(args))


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.WARNING, stream=sys.stderr, format="%(levelname)s %(name)s: %(message)s")
    prepare_environment()
    try:
        # Libraries that print progress to stdout must not corrupt the one JSON object.
        with contextlib.redirect_stdout(sys.stderr), _session(args):
            payload = args.func(args)
    except (CliError, CustomerConfigError, FileNotFoundError, ValueError) as error:
        if getattr(args, "json", False):
            sys.stdout.write(json.dumps({"error": str(error)}) + "\n")
        else:
            print(f"error: {error}", file=sys.stderr)
        return 1
    emit(payload, getattr(args, "json", False), args.human)
    return getattr(args, "exit_code", lambda payload: 0)(payload)


if __name__ == "__main__":
    sys.exit(main())
