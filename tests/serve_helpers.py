"""A real uvicorn server on a free loopback port, in a background thread (for the server tests)."""
from __future__ import annotations

import socket
import threading
import time


class LiveServer:
    """`with LiveServer(app) as s: s.url` — uvicorn serving `app` on 127.0.0.1:<free port>."""

    def __init__(self, app):
        import uvicorn
        self.app = app
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on"))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True)

    def __enter__(self) -> "LiveServer":
        self.thread.start()
        deadline = time.monotonic() + 60
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the test server did not start")
            time.sleep(0.02)
        return self

    def __exit__(self, *exc) -> None:
        self.server.should_exit = True
        self.thread.join(30)
        self.sock.close()


def wait_until(cond, what: str, limit: float = 60.0, every: float = 0.02) -> None:
    """Poll `cond()` until true; a liveness bound (a hang fails), not a timing assertion."""
    deadline = time.monotonic() + limit
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"gave up waiting for {what}")
        time.sleep(every)


def wait_for_server(p, url: str) -> None:
    """Until the `specfold serve` process `p` answers /health at `url` (its stderr if it exits first)."""
    import httpx

    def up():
        assert p.poll() is None, p.stderr.read()
        try:
            return httpx.get(url + "/health", timeout=5).status_code == 200
        except httpx.TransportError:
            return False
    wait_until(up, "specfold serve to start", limit=300, every=0.2)
