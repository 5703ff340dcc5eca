"""Running the app under uvicorn: loopback by default, graceful shutdown on SIGINT/SIGTERM."""

from __future__ import annotations

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
                          limit_concurrency=None, backlog=2048)
    return uvicorn.Server(ucfg)


def serve(config: ServerConfig, models=None) -> None:
    """Serve until a signal stops it (``runtime-core serve``)."""
    make_server(config, models).run()


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
