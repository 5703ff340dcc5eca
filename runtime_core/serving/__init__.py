"""Serving models over HTTP: the Open Inference Protocol v2 (KServe / Triton REST), dynamic
batching, metrics, and a page that shows each model's partition (``runtime-core serve``).

The HTTP stack (starlette, uvicorn, prometheus_client) comes with the ``runtime-core[serve]``
extra and is imported only by :mod:`.app` and :mod:`.server`; :mod:`.page` (the partition
picture) and :mod:`.codec` need nothing beyond numpy.
"""

from .config import ModelConfig, ServerConfig

__all__ = ["ModelConfig", "ServerConfig", "create_app", "BackgroundServer"]


def __getattr__(name):  # the web stack is imported on first use
    if name == "create_app":
        from .app import create_app

        return create_app
    if name == "BackgroundServer":
        from .server import BackgroundServer

        return BackgroundServer
    raise AttributeError(name)
