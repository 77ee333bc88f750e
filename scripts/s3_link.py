"""An S3 bucket behind a shaped link, for ``bench io s3://…`` and the data-wait figures of docs/data.md.

SeaweedFS (``tests/object_store.py``) runs in its own network namespace (``i50-s3``), joined to this
host by a veth pair whose two ends are shaped by ``tc``'s token bucket (``tbf``) to ``--rate-mbit``.
``tc``'s delay (``netem``) is not in every kernel, so latency comes from ``tests/delay_proxy.py`` on
this host: every response is held ``--latency-ms``; a second proxy also holds ``--delay-fraction`` of
the responses ``--delay-ms`` more (stragglers). The script writes the client's variables to
``--env`` (``AWS_ENDPOINT_URL``: the plain link; ``DELAYED_ENDPOINT_URL``: the one with stragglers),
runs until SIGTERM or Ctrl-C, then removes the namespace, the veth pair and the processes. Needs root
(``ip netns``)::

    sudo python scripts/s3_link.py --rate-mbit 200 --latency-ms 10 --env link.env &
    . link.env && jigsaw-earth bench io s3://bench/rows.zarr --mesh 2x2 --ranks 0 --cache warm
"""

from __future__ import annotations

import argparse
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.object_store import S3Server

NETNS, HOST_END, SERVER_END = "i50-s3", "i50-s3h", "i50-s3s"
HOST_IP, SERVER_IP = "10.250.50.1", "10.250.50.2"


def _sh(*cmd: str) -> None:
    subprocess.run(cmd, check=True)


def _link_up(rate_mbit: float) -> None:
    _sh("ip", "netns", "add", NETNS)
    _sh("ip", "link", "add", HOST_END, "type", "veth", "peer", "name", SERVER_END)
    _sh("ip", "link", "set", SERVER_END, "netns", NETNS)
    _sh("ip", "addr", "add", f"{HOST_IP}/30", "dev", HOST_END)
    _sh("ip", "link", "set", HOST_END, "up")
    ns = ("ip", "netns", "exec", NETNS)
    _sh(*ns, "ip", "addr", "add", f"{SERVER_IP}/30", "dev", SERVER_END)
    _sh(*ns, "ip", "link", "set", SERVER_END, "up")
    _sh(*ns, "ip", "link", "set", "lo", "up")
    shape = ("root", "tbf", "rate", f"{rate_mbit}mbit", "burst", "256kb", "latency", "50ms")
    _sh("tc", "qdisc", "add", "dev", HOST_END, *shape)
    _sh(*ns, "tc", "qdisc", "add", "dev", SERVER_END, *shape)


def _link_down() -> None:
    subprocess.run(["ip", "netns", "del", NETNS], check=False)
    subprocess.run(["ip", "link", "del", HOST_END], check=False, stderr=subprocess.DEVNULL)


def _proxy(target: str, latency_ms: float, fraction: float, delay_ms: float) -> tuple[subprocess.Popen, str]:
    script = Path(__file__).resolve().parents[1] / "tests" / "delay_proxy.py"
    proc = subprocess.Popen(
        [sys.executable, str(script), "--target", target, "--latency-ms", str(latency_ms),
         "--delay-fraction", str(fraction), "--delay-ms", str(delay_ms)],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    return proc, f"http://127.0.0.1:{proc.stdout.readline().strip()}"  # type: ignore[union-attr]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rate-mbit", type=float, default=200.0, help="bandwidth of the link, each way")
    p.add_argument("--latency-ms", type=float, default=10.0, help="added to every response")
    p.add_argument("--delay-fraction", type=float, default=0.05, help="stragglers on the second endpoint")
    p.add_argument("--delay-ms", type=float, default=500.0)
    p.add_argument("--env", type=Path, required=True, help="file to write the client's variables to")
    a = p.parse_args(argv)
    _link_down()  # a namespace an earlier run left
    procs: list[subprocess.Popen] = []
    server = None
    try:
        _link_up(a.rate_mbit)
        server = S3Server.start(Path(tempfile.mkdtemp(prefix="i50-s3-")), ip=SERVER_IP, netns=NETNS)
        target = server.endpoint.removeprefix("http://")
        plain, plain_url = _proxy(target, a.latency_ms, 0.0, 0.0)
        delayed, delayed_url = _proxy(target, a.latency_ms, a.delay_fraction, a.delay_ms)
        procs += [plain, delayed]
        env = {**server.env, "AWS_ENDPOINT_URL": plain_url, "DELAYED_ENDPOINT_URL": delayed_url}
        a.env.write_text("".join(f"export {k}={v}\n" for k, v in env.items()))
        print(
            f"link up: {a.rate_mbit} Mbit/s, {a.latency_ms} ms per request; variables in {a.env}", flush=True
        )
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
        while True:
            time.sleep(1)
    except KeyboardInterrupt:
        pass
    finally:
        for proc in procs:
            proc.terminate()
        if server is not None:
            server.stop()
        _link_down()
    return 0


if __name__ == "__main__":
    sys.exit(main())
