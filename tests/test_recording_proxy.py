"""The benchmarks' recording proxy: it forwards and records, and closing it lets its connections go."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest

from benchmarks.recording_proxy import RecordingProxy


class _Upstream(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        body = json.dumps({"choices": [], "usage": {"input_tokens": 7, "cache_read_input_tokens": 3}}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *_args: object) -> None:
        pass


@pytest.fixture
def upstream() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Upstream)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def test_a_proxy_records_and_a_closed_one_lets_its_connections_go(upstream: str) -> None:
    proxy = RecordingProxy(upstream)
    with httpx.Client() as client:  # keep-alive: the proxy's handler for this connection stays open
        assert client.post(proxy.url + "/v1/messages", json={"x": 1}).status_code == 200
        (exchange,) = proxy.exchanges
        deadline = time.monotonic() + 5  # the proxy reads the usage after the client has the answer
        while exchange.seconds == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert (exchange.status, exchange.prompt_tokens, exchange.cached_tokens) == (200, 10, 3)
        proxy.close()
        # Closed, not merely stopped: a stopped loop leaves the socket listening and the kept-alive
        # connection open, its handler pending, and a request would wait for an answer forever.
        with pytest.raises((httpx.ConnectError, httpx.RemoteProtocolError)):
            client.post(proxy.url + "/v1/messages", json={"x": 2}, timeout=3)
