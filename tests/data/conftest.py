"""Fixtures for data tests: small generated datasets and a local HTTP server on 127.0.0.1."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from datafiles import CifarSet, IdxSet, Server, make_cifar_set, make_idx_set


@pytest.fixture
def http_server() -> Iterator[Server]:
    """A threaded HTTP server on 127.0.0.1 (an ephemeral port), shut down after the test."""
    state = Server(url="")

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            state.hits.append(self.path)
            if self.path not in state.routes:
                self.send_error(404)
                return
            body, mode = state.routes[self.path]
            self.send_response(200)
            self.send_header("Content-Type", "application/octet-stream")
            self.send_header("Content-Length", str(len(body) + (1000 if mode == "short" else 0)))
            self.end_headers()
            self.wfile.write(body[: len(body) // 2] if mode == "cut" else body)
            self.wfile.flush()
            self.close_connection = True

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    state.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        yield state
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


@pytest.fixture
def idx_set() -> IdxSet:
    """A small MNIST-like dataset: 40 train and 20 test images."""
    return make_idx_set()


@pytest.fixture
def cifar_set() -> CifarSet:
    """A small CIFAR-10-like dataset: 4 images per batch (20 train, 4 test)."""
    return make_cifar_set()
