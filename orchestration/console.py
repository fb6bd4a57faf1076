"""What a person sees while the CLI runs Dagster jobs in-process.

Dagster's own console logger prints every event at DEBUG (STEP_START, HANDLED_OUTPUT, ...): a
demo run was 71 such lines among 116. Inside a `console_session` every job the CLI runs instead
gets a listener on its run id, and
- every event goes, formatted one per line, to a log file under `$SEARCHSMITH_HOME/logs/`
  (its path is printed when the session ends), and to stderr as well with `-v`;
- on a terminal (and not with `--json`), a status line shows the running step, its elapsed time
  and the step's latest log message, so a step that works for minutes is visibly alive;
- each finished step prints one line with its key figures and its duration
  (`chroma_index      3,026 chunks embedded  2m41s`), a failing asset check one line too.

Library logging below ERROR, Python warnings and what libraries print on stdout go to the log
file only (with `-v`, to stderr too), so the terminal keeps what a person acts on.

Simplified: the status line is per step, not a bar per item inside a step (documents synced,
chunks embedded): the stage packages expose no progress hooks to the assets yet.
"""

from __future__ import annotations

import contextlib
import logging
import re
import sys
import threading
import time
import uuid
from contextvars import ContextVar
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Iterator, TextIO

OUR_LOGGERS = ("core", "corpus", "search", "agent", "synth", "training", "evaluation", "serving", "assets", "orchestration", "searchsmith")
SPINNER = "⠋⠙⠹⠸⠼⠴⠦⠧⠇⠏"
FOREIGN_LINE_GRACE_S = 2.0  # a bar that has not redrawn for this long is taken to be done


# -- figures -----------------------------------------------------------------------------------


def duration(seconds: float) -> str:
    """`7s`, `2m41s`, `1h02m`."""
    seconds = max(0, int(round(seconds)))
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


def _n(value: Any) -> str:
    try:
        return f"{int(value):,}"
    except (TypeError, ValueError):
        return str(value)


def _rate(value: Any) -> str:
    return f"{value:.3f}" if isinstance(value, (int, float)) and not isinstance(value, bool) else "-"


def _best(metadata: dict[str, Any], suite: str = "test") -> str:
    """`best answer found 0.667 (hybrid)` from benchmark_report's numeric `suite/candidate/metric` keys."""
    found = {key.split("/")[1]: value for key, value in metadata.items()
             if key.startswith(f"{suite}/") and key.endswith("/answer_found") and key.count("/") == 2}
    if not found:
        return ""
    name = max(found, key=lambda candidate: found[candidate])
    return f"; {suite}: best answer found {_rate(found[name])} ({name})"


def _checkpoint(metadata: dict[str, Any]) -> str:
    if metadata.get("reused"):
        return "reused (nothing that determines it changed)"
    steps = metadata.get("steps", 0)
    parts = [f"{_n(steps)} step{'' if steps == 1 else 's'}"]
    for key in ("loss", "reward"):
        if isinstance(metadata.get(key), (int, float)):
            parts.append(f"{key} {metadata[key]:.4g}")
    return ", ".join(parts)


def _reranker(metadata: dict[str, Any]) -> str:
    if metadata.get("enabled") is False:
        return "off (training.reranker.enabled: false)"
    trained = "reused" if metadata.get("reused") else \
        f"{_n(int(metadata['train/pairs']))} pairs at {metadata['train/pairs_per_s']:.1f} pairs/s"
    dev = {row: metadata[f"dev/{row}/recall_at_k"] for row in ("trained", "start", "hybrid")}
    return (f"{trained}; dev recall@k {dev['trained']:.3f} (start {dev['start']:.3f}, hybrid {dev['hybrid']:.3f}) "
            f"on {_n(int(metadata['dev/trained/tasks']))} tasks")


STEP_FIGURES: dict[str, Callable[[dict[str, Any]], str]] = {
    "raw_documents": lambda m: f"{_n(m.get('documents', 0))} documents (added {_n(m.get('added', 0))}, changed {_n(m.get('changed', 0))}, "
                               f"deleted {_n(m.get('deleted', 0))}, quarantined {_n(m.get('quarantined', 0))})",
    "chunks": lambda m: f"{_n(m.get('chunks', 0))} chunks ({_n(m.get('rechunked_documents', 0))} documents rechunked)",
    "chroma_index": lambda m: f"{_n(m.get('embedded', 0))} chunks embedded, {_n(m.get('deleted', 0))} deleted, {_n(m.get('total', 0))} in the index",
    "synthetic_tasks": lambda m: f"{_n(m.get('generated', 0))} tasks generated, {_n(m.get('verified', 0))} passed verification",
    "verified_tasks": lambda m: f"{_n(m.get('verified', 0))} verified tasks "
                                f"({', '.join(f'{k} {_n(v)}' for k, v in (m.get('by_split') or {}).items())})",
    "distractor_sets": lambda m: f"{_n(m.get('distractors', 0))} distractors for {_n(m.get('tasks', 0))} tasks",
    "reranker_checkpoint": _reranker,
    "sft_trajectories": lambda m: f"{_n(m.get('kept', 0))} teacher trajectories kept",
    "sft_checkpoint": _checkpoint,
    "cispo_checkpoint": _checkpoint,
    "benchmark_report": lambda m: f"{len(m.get('candidates') or [])} candidates on {', '.join(m.get('suites') or []) or 'no suite'}{_best(m)}",
    "served_model": lambda m: f"{'promoted' if m.get('promoted') else 'not promoted'}: {m.get('reason', '')}",
}


def step_figures(asset: str, metadata: dict[str, Any]) -> str:
    """One line of what a finished step produced, from its materialization metadata."""
    figures = STEP_FIGURES.get(asset)
    if figures is not None:
        try:
            return figures(metadata)
        except (KeyError, TypeError, ValueError, AttributeError):
            pass  # metadata of another shape: fall back to its first numbers
    numbers = [f"{k} {_n(v) if isinstance(v, int) else _rate(v)}" for k, v in metadata.items()
               if isinstance(v, (int, float)) and not isinstance(v, bool)]
    return ", ".join(numbers[:4])


def _plain(value: Any) -> Any:
    return getattr(value, "value", value)


def check_reason(description: str | None, metadata: dict[str, Any] | None, limit: int = 240) -> str:
    """Why a check failed, in one line: its description, else its figures (`by_split {'train':
    0, ...}, min_per_split 5`), so a person sees what to change without opening the UI."""
    if description:
        text = " ".join(description.split())
    else:
        text = ", ".join(f"{key} {_plain(value)}" for key, value in (metadata or {}).items())
    return text if len(text) <= limit else text[: limit - 3] + "..."


# -- the log file format -----------------------------------------------------------------------


def event_line(entry: Any) -> str:
    """One event as one log-file line: time, level, job, step, event type, message."""
    stamp = datetime.fromtimestamp(entry.timestamp, timezone.utc).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]
    level = logging.getLevelName(entry.level) if isinstance(entry.level, int) else str(entry.level)
    kind = entry.dagster_event.event_type_value if entry.dagster_event else "LOG"
    message = (entry.message or "").replace("\n", "\n    ")
    return f"{stamp} {level:<7} {entry.job_name or '-'} {entry.step_key or '-'} {kind} - {message}"


# -- the console -------------------------------------------------------------------------------


class RunConsole:
    """Receives every event of the runs it is attached to (`instance.add_event_listener`)."""

    def __init__(self, log: TextIO, stream: TextIO, *, verbose: bool = False, live: bool = False, name_width: int = 17):
        self.log, self.stream, self.verbose, self.live = log, stream, verbose, live
        self.name_width = name_width
        self.lock = threading.RLock()
        self.running: dict[str, float] = {}  # step key -> start time (monotonic)
        self.detail: dict[str, str] = {}  # step key -> its latest log message
        self.metadata: dict[str, dict[str, Any]] = {}  # asset -> metadata of this session's last materialization
        self.steps: list[str] = []  # finished step lines, in order
        self.checks: dict[str, bool | str] = {}  # check name -> passed (True), failed (False) or "warn", this session
        self.check_steps: set[str] = set()  # steps that evaluated checks: no line of their own when they pass
        self._status_width = 0
        self._stop = threading.Event()
        self._ticker: threading.Thread | None = None
        self._foreign_line_at: float | None = None  # when another writer left a line open (a library's bar)

    # -- events --
    def __call__(self, entry: Any) -> None:
        line = event_line(entry)
        with self.lock:
            self.log.write(line + "\n")
            self.log.flush()
            if self.verbose:
                self._print(line)
            self._handle(entry)

    def _handle(self, entry: Any) -> None:
        event, step = entry.dagster_event, entry.step_key
        if event is None:
            if step and entry.user_message:
                self.detail[step] = entry.user_message.splitlines()[0][:120]
            return
        if event.is_step_start and step:
            self.running[step] = time.monotonic()
            self.detail.pop(step, None)
            self._clear_status()
            self._draw_status()
        elif event.is_step_materialization:
            materialization = event.step_materialization_data.materialization
            self.metadata[materialization.asset_key.to_user_string()] = {k: _plain(v) for k, v in materialization.metadata.items()}
        elif event.event_type_value == "ASSET_CHECK_EVALUATION":
            check = event.asset_check_evaluation_data
            warned = not check.passed and getattr(check.severity, "value", check.severity) == "WARN"  # non-blocking
            self.checks[check.check_name] = True if check.passed else ("warn" if warned else False)
            if step:
                self.check_steps.add(step)
            if not check.passed:
                why = check_reason(check.description, check.metadata)
                self._print(f"  check {check.check_name} {'WARNING' if warned else 'FAILED'} on {check.asset_key.to_user_string()}"
                            + (f": {why}" if why else ""))
        elif event.is_step_up_for_retry and step:
            self._print(f"  {step}: retrying ({(event.message or '').splitlines()[0][:160]})")
        elif (event.is_step_success or event.is_step_failure) and step:
            started = self.running.pop(step, None)
            elapsed = duration(time.monotonic() - started) if started is not None else "-"
            if event.is_step_success and step in self.check_steps and step not in self.metadata:
                return  # a passing check step: counted in the closing `checks` line
            if event.is_step_success:
                figures = step_figures(step, self.metadata.get(step, {}))
                text = f"{step:<{self.name_width}} {figures}  {elapsed}" if figures else f"{step:<{self.name_width}} done  {elapsed}"
            else:
                error = event.step_failure_data.error if event.step_failure_data else None
                reason = (error.cause.message if error is not None and error.cause else error.message if error else "").strip()
                text = f"{step:<{self.name_width}} FAILED  {elapsed}: {reason.splitlines()[-1][:200] if reason else ''}"
            self.steps.append(text)
            self._print(text)

    # -- output --
    def note(self, text: str) -> None:
        """A progress message from our own code (an INFO log record) for the latest running step."""
        with self.lock:
            if self.running:
                self.detail[next(reversed(self.running))] = text.splitlines()[0][:120] if text else ""

    def _print(self, text: str) -> None:
        with self.lock:
            self._clear_status()
            self._end_foreign_line()
            self.stream.write(text + "\n")
            self.stream.flush()
            self._draw_status()

    def _end_foreign_line(self) -> None:
        """A library's bar left its line open (no newline yet): what we write next starts a new
        line, so scripts still find our lines by their first word."""
        if self._foreign_line_at is not None:
            self.stream.write("\n")
            self._foreign_line_at = None

    def _clear_status(self) -> None:
        if self.live and self._status_width:
            self.stream.write("\r" + " " * self._status_width + "\r")
            self._status_width = 0

    def foreign_write(self, text: str) -> None:
        """Someone else writes to the terminal (a library's progress bar, a warning): the status
        line makes way, and stays away while their line is open (a bar redrawing itself)."""
        with self.lock:
            self._clear_status()
            self.stream.write(text)
            if text:
                self._foreign_line_at = None if text.endswith("\n") else time.monotonic()

    def _draw_status(self) -> None:
        if not self.live or not self.running:
            return
        now = time.monotonic()
        if self._foreign_line_at is not None and now - self._foreign_line_at < FOREIGN_LINE_GRACE_S:
            return
        frame = SPINNER[int(now * 4) % len(SPINNER)]
        parts = []
        for step, started in self.running.items():
            detail = self.detail.get(step)
            parts.append(f"{step} {duration(now - started)}" + (f" ({detail})" if detail else ""))
        text = f"{frame} " + "; ".join(parts)
        width = _terminal_width(self.stream) - 1
        text = text[:width]
        self.stream.write("\r" + text)
        self.stream.flush()
        self._status_width = len(text)
        self._foreign_line_at = None  # a quiet bar's line now holds the status line, which is cleared before we print

    def _tick(self) -> None:
        while not self._stop.wait(0.25):
            with self.lock:
                self._clear_status()
                self._draw_status()

    def start(self) -> None:
        if self.live and self._ticker is None:
            self._ticker = threading.Thread(target=self._tick, name="searchsmith-status", daemon=True)
            self._ticker.start()

    def stop(self) -> None:
        self._stop.set()
        if self._ticker is not None:
            self._ticker.join(timeout=2)
        with self.lock:
            self._clear_status()
            self._end_foreign_line()  # the `checks` line and the session's `event log:` line start their own
            if self.checks:
                failed = sorted(name for name, passed in self.checks.items() if passed is False)
                warned = sorted(name for name, passed in self.checks.items() if passed == "warn")
                passed = len(self.checks) - len(failed) - len(warned)
                self.stream.write(f"{'checks':<{self.name_width}} {passed} of {len(self.checks)} passed"
                                  + (f"; WARNING: {', '.join(warned)}" if warned else "")
                                  + (f"; FAILED: {', '.join(failed)}" if failed else "") + "\n")
            self.stream.flush()


def _terminal_width(stream: TextIO) -> int:
    import os
    import shutil

    try:
        return os.get_terminal_size(stream.fileno()).columns
    except (OSError, ValueError, AttributeError):
        return shutil.get_terminal_size().columns


# -- sessions ----------------------------------------------------------------------------------

_active: ContextVar[RunConsole | None] = ContextVar("searchsmith_console", default=None)

# Dagster's console logger is kept for errors only: the listener writes everything else.
QUIET_CONSOLE_LOGGER = {"loggers": {"console": {"config": {"log_level": "CRITICAL"}}}}


def job_run_options(instance: Any) -> dict[str, Any]:
    """`execute_in_process` options for a job the CLI runs: inside a console session, a run id
    whose events go to the session's listener and a quiet Dagster console logger; outside one
    (tests, scripts, `dagster dev`), nothing: Dagster's defaults."""
    console = _active.get()
    if console is None:
        return {}
    run_id = str(uuid.uuid4())
    instance.add_event_listener(run_id, console)
    return {"run_id": run_id, "run_config": QUIET_CONSOLE_LOGGER}


def log_path_for(home: Path, command: str) -> Path:
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%S")
    safe = re.sub(r"[^a-z0-9-]+", "-", command.lower()).strip("-") or "run"
    folder = home / "logs"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{stamp}-{safe}.log"
    suffix = 1
    while path.exists():
        suffix += 1
        path = folder / f"{stamp}-{safe}-{suffix}.log"
    return path


class _OnTerminal(logging.Filter):
    """stderr without `-v`: our own warnings and anyone's errors; library warnings and Python
    warnings (`py.warnings`) go to the log file only."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.name == "py.warnings":
            return False
        ours = record.name.split(".")[0] in OUR_LOGGERS
        return record.levelno >= logging.ERROR or (ours and record.levelno >= logging.WARNING)


class _StatusDetail(logging.Handler):
    """Our own INFO records (a benchmark candidate done, a CISPO step, an external file being
    indexed) become the status line's detail: progress a person sees without a bar."""

    def __init__(self, console: RunConsole):
        super().__init__(logging.INFO)
        self.console = console

    def emit(self, record: logging.LogRecord) -> None:
        if record.name.split(".")[0] in OUR_LOGGERS and record.levelno < logging.WARNING:
            try:
                self.console.note(record.getMessage())
            except Exception:  # a malformed record must not break the command
                self.handleError(record)


class _Terminal:
    """sys.stderr during a session: other writers go through `RunConsole.foreign_write`."""

    def __init__(self, console: RunConsole, real: TextIO):
        self.console, self.real = console, real

    def write(self, text: str) -> int:
        self.console.foreign_write(text)
        return len(text)

    def flush(self) -> None:
        self.real.flush()

    def __getattr__(self, name: str) -> Any:  # isatty, fileno, encoding, ... of the real terminal
        return getattr(self.real, name)


class _Printed:
    """A stdout for library prints: into the log file, under the console's lock."""

    def __init__(self, console: RunConsole):
        self.console = console

    def write(self, text: str) -> int:
        with self.console.lock:
            self.console.log.write(text)
        return len(text)

    def flush(self) -> None:
        with self.console.lock:
            self.console.log.flush()

    def isatty(self) -> bool:
        return False


@contextlib.contextmanager
def console_session(home: Path, command: str, *, verbose: bool, live: bool, stream: TextIO | None = None) -> Iterator[RunConsole]:
    """Route job events and library logging for one CLI command (module doc); prints the log
    file's path on `stream` when it ends, if any job ran or anything was logged."""
    stream = stream if stream is not None else sys.stderr
    path = log_path_for(home, command)
    log = path.open("a", encoding="utf-8")
    console = RunConsole(log, stream, verbose=verbose, live=live)
    file_handler = logging.StreamHandler(log)
    file_handler.setLevel(logging.DEBUG if verbose else logging.INFO)
    formatter = logging.Formatter("%(asctime)s %(levelname)-7s %(name)s - %(message)s")
    formatter.default_msec_format = "%s.%03d"  # the same stamps as the event lines
    file_handler.setFormatter(formatter)
    root = logging.getLogger()
    stderr_handlers = [h for h in root.handlers if isinstance(h, logging.StreamHandler) and getattr(h, "stream", None) in (sys.stderr, stream)]
    quiet = _OnTerminal()
    saved_level = root.level
    root.addHandler(file_handler)
    detail = _StatusDetail(console)
    if live:
        root.addHandler(detail)
    if not verbose:
        root.setLevel(logging.INFO)
        for handler in stderr_handlers:
            handler.addFilter(quiet)
    logging.captureWarnings(True)
    token = _active.set(console)
    # Library bars and our own stderr handlers go through the console, live or not: the status
    # line makes way for them, and a step's line never lands at the end of a bar's open line.
    terminal = _Terminal(console, stream)
    saved_stderr, saved_streams = sys.stderr, [(handler, handler.stream) for handler in stderr_handlers]
    sys.stderr = terminal
    for handler in stderr_handlers:
        handler.setStream(terminal)
    console.start()
    # What libraries print (a trainer's log dicts, download notes) is for the log file too.
    printed = contextlib.nullcontext() if verbose else contextlib.redirect_stdout(_Printed(console))
    try:
        with printed:
            yield console
    finally:
        _active.reset(token)
        console.stop()
        sys.stderr = saved_stderr
        for handler, original in saved_streams:
            handler.setStream(original)
        logging.captureWarnings(False)
        root.removeHandler(file_handler)
        root.removeHandler(detail)
        root.setLevel(saved_level)
        for handler in stderr_handlers:
            handler.removeFilter(quiet)
        log.close()
        if path.stat().st_size:
            stream.write(f"event log: {path}\n")
            stream.flush()
        else:
            path.unlink()
