"""A TCP proxy that delays responses: latency per request, and a chosen fraction of requests held back.

Run as a process between an HTTP client and a server (the tests put it in front of SeaweedFS's S3
port)::

    python tests/delay_proxy.py --target 127.0.0.1:8333 --latency-ms 10 --delay-fraction 0.05 --delay-ms 500

It listens on a free port of 127.0.0.1 and prints that port on its first line of output. Every
client connection gets its own connection to the target. HTTP/1.1 clients send a request and read
its whole response before the next one on the same connection, so the first bytes from the server
after bytes from the client begin a response: each such response is held ``--latency-ms``, and with
probability ``--delay-fraction`` (a seeded generator: the same requests every run) ``--delay-ms``
more. On SIGTERM it prints the responses seen and delayed to stderr and exits.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import signal
import sys

__all__ = ["DelayProxy", "main"]


class DelayProxy:
    """The proxy's state: settings, counters and its seeded generator."""

    def __init__(self, target: tuple[str, int], latency: float, fraction: float, delay: float, seed: int):
        self.target, self.latency, self.fraction, self.delay = target, latency, fraction, delay
        self.random = random.Random(seed)
        self.responses = self.delayed = 0
        self.clients: set[asyncio.StreamWriter] = set()

    async def _client_to_server(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                                state: dict[str, bool]) -> None:  # fmt: skip
        while data := await reader.read(1 << 16):
            state["request"] = True
            writer.write(data)
            await writer.drain()
        writer.write_eof() if writer.can_write_eof() else writer.close()

    async def _server_to_client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                                state: dict[str, bool]) -> None:  # fmt: skip
        while data := await reader.read(1 << 16):
            if state["request"]:  # the first bytes of a response
                state["request"] = False
                self.responses += 1
                hold = self.latency
                if self.random.random() < self.fraction:
                    self.delayed += 1
                    hold += self.delay
                if hold:
                    await asyncio.sleep(hold)
            writer.write(data)
            await writer.drain()
        writer.close()

    async def handle(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        try:
            server_r, server_w = await asyncio.open_connection(*self.target)
        except OSError:
            client_w.close()
            return
        state = {"request": False}
        self.clients.add(client_w)
        tasks = [
            asyncio.create_task(self._client_to_server(client_r, server_w, state)),
            asyncio.create_task(self._server_to_client(server_r, client_w, state)),
        ]
        try:
            await asyncio.gather(*tasks)
        except (ConnectionError, OSError, asyncio.CancelledError):  # cancelled: the proxy is stopping
            pass
        finally:
            for t in tasks:
                t.cancel()
            self.clients.discard(client_w)
            for w in (client_w, server_w):
                w.close()


async def _serve(proxy: DelayProxy, host: str, port: int) -> None:
    server = await asyncio.start_server(proxy.handle, host, port)
    print(server.sockets[0].getsockname()[1], flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    # Clients keep idle connections open: close them too (a server's wait_closed() waits for them).
    server.close()
    for writer in list(proxy.clients):
        writer.close()
    print(f"responses {proxy.responses} delayed {proxy.delayed}", file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--target", required=True, help="HOST:PORT of the server")
    p.add_argument("--listen", default="127.0.0.1:0", help="HOST:PORT to listen on (port 0: a free one)")
    p.add_argument("--latency-ms", type=float, default=0.0, help="added to every response")
    p.add_argument("--delay-fraction", type=float, default=0.0, help="fraction of responses delayed more")
    p.add_argument("--delay-ms", type=float, default=500.0, help="the extra delay of those")
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args(argv)
    host, port = a.target.rsplit(":", 1)
    lhost, lport = a.listen.rsplit(":", 1)
    proxy = DelayProxy((host, int(port)), a.latency_ms / 1e3, a.delay_fraction, a.delay_ms / 1e3, a.seed)
    asyncio.run(_serve(proxy, lhost, int(lport)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
