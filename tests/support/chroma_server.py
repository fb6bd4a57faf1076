"""A real Chroma server (`chroma run`) on a free loopback port, stopped with its process group."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.request
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import pytest

from tests.support.seaweed import free_ports, log_tail

READY_TIMEOUT_S = 90.0


def find_chroma() -> Path | None:
    binary = Path(sys.executable).parent / "chroma"
    return binary if binary.exists() else None


@contextmanager
def chroma_server(folder: Path) -> Iterator[int]:
    """Serve a Chroma database kept in `folder`; yields the port."""
    binary = find_chroma()
    if binary is None:
        pytest.skip("the chroma CLI is not installed beside this Python (pip install chromadb)")
    folder.mkdir(parents=True, exist_ok=True)
    (port,) = free_ports(1)
    log_path = folder / "chroma-server.log"
    with open(log_path, "wb") as log:
        process = subprocess.Popen(
            [str(binary), "run", "--host", "127.0.0.1", "--port", str(port), "--path", str(folder / "data")],
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
            env={**os.environ, "ANONYMIZED_TELEMETRY": "False"},
        )
    try:
        deadline = time.monotonic() + READY_TIMEOUT_S
        while True:
            if process.poll() is not None:
                pytest.fail(f"chroma run exited with {process.returncode}: {log_tail(log_path)}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/v2/heartbeat", timeout=1) as response:
                    if response.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"chroma run did not answer its heartbeat within {READY_TIMEOUT_S:.0f} s: {log_tail(log_path)}")
            time.sleep(0.2)
        yield port
    finally:
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(process.pid, sig)
                process.wait(timeout=10)
                break
            except ProcessLookupError:
                break
            except subprocess.TimeoutExpired:
                continue
