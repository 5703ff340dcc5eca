"""Running the app under uvicorn: loopback by default, graceful shutdown on SIGINT/SIGTERM."""

from __future__ import annotations

import gc
import logging
import socket
import threading

from .config import ServerConfig

logger = logging.getLogger("runtime_core.serving")


def make_server(config: ServerConfig, models=None):
    """A ``uvicorn.Server`` for the app (``models``: ServedModels already loaded, else loaded here).

    On SIGTERM/SIGINT it stops accepting, finishes the requests in flight (up to
    ``graceful_timeout_s``), then drains each model's queue."""
    import uvicorn

    from .app import create_app

    app = create_app(config, models)
    ucfg = uvicorn.Config(app, host=config.host, port=config.port, access_log=False, log_config=None,
                          timeout_graceful_shutdown=config.graceful_timeout_s, lifespan="on",
                          limit_concurrency=None, backlog=2048, http=_protocol_class())
    return uvicorn.Server(ucfg)


def _protocol_class():
    """uvicorn's httptools protocol, writing each response's head and body in one ``send``: it writes
    them apart (two system calls, two wake-ups of the client per request); "auto" where httptools is
    missing."""
    try:
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
    except ImportError:
        return "auto"

    class CoalescingHttpToolsProtocol(HttpToolsProtocol):
        def connection_made(self, transport) -> None:
            super().connection_made(HeadWithBody(transport))

        def on_response_complete(self) -> None:
            self.transport.flush()  # a response without a body write (HEAD, 204)
            super().on_response_complete()

    return CoalescingHttpToolsProtocol


class HeadWithBody:
    """The connection's transport, holding a response head back until its body (or anything
    else) is written."""

    def __init__(self, transport):
        self._t = transport
        self._head: bytes | None = None

    def write(self, data) -> None:
        if self._head is not None:
            data, self._head = self._head + bytes(data), None
        elif data[:9] == b"HTTP/1.1 " and data[-4:] == b"\r\n\r\n" and data[9:10] != b"1":  # not 100/101
            self._head = bytes(data)
            return
        self._t.write(data)

    def flush(self) -> None:
        if self._head is not None:
            head, self._head = self._head, None
            self._t.write(head)

    def close(self) -> None:
        self.flush()
        self._t.close()

    def __getattr__(self, name):
        return getattr(self._t, name)


def serve(config: ServerConfig, models=None) -> None:
    """Serve until a signal stops it (``runtime-core serve``)."""
    server = make_server(config, models)
    # the models and the app are loaded and live until exit: the collector need not walk them again
    gc.collect()
    gc.freeze()
    server.run()


class BackgroundServer:
    """A server on a free loopback port in a thread of this process (tests, notebooks):
    ``with BackgroundServer(cfg) as s: s.url``."""

    def __init__(self, config: ServerConfig, models=None):
        with socket.socket() as s:  # a free port now; uvicorn binds it a moment later
            s.bind((config.host, 0))
            config.port = s.getsockname()[1]
        self.config = config
        self.server = make_server(config, models)
        self.server.install_signal_handlers = lambda: None  # not the main thread
        self.thread = threading.Thread(target=self.server.run, name="runtime-core-serve", daemon=True)
        self.url = f"http://{config.host}:{config.port}"

    def __enter__(self) -> BackgroundServer:
        self.thread.start()
        import time

        t0 = time.monotonic()
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() - t0 > 60:
                raise RuntimeError("the server did not start")
            time.sleep(0.02)
        return self

    def __exit__(self, *exc) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=60)
