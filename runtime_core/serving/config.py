"""What the server serves and how: one :class:`ModelConfig` per model, one :class:`ServerConfig`.

A config file is JSON::

    {"host": "127.0.0.1", "port": 8000, "max_request_bytes": 67108864,
     "models": [{"path": "cnn.onnx", "name": "cnn", "providers": ["cpu"],
                 "max_batch_size": 16, "max_queue_delay_ms": 2, "max_concurrency": 2,
                 "timeout_s": 30}]}

Paths are relative to the file's folder. Command-line flags override the file's server fields and
fill in what a model entry leaves out.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field, fields
from pathlib import Path

from ..cli_args import UsageError


@dataclass
class ModelConfig:
    """One served model.

    ``max_batch_size`` > 1 turns on dynamic batching (only for a model whose inputs and outputs
    all have a free first dimension); ``max_queue_delay_ms`` is how long the first request of a
    batch waits for others; ``max_concurrency`` bounds the model's runs at a time;
    ``timeout_s`` bounds a request from arrival to answer (the run is terminated past it);
    ``max_queue`` bounds the requests waiting for a run (more get HTTP 503)."""

    path: str
    name: str = ""
    providers: list | None = None
    max_batch_size: int = 0
    max_queue_delay_ms: float = 2.0
    max_concurrency: int = 1
    timeout_s: float = 60.0
    max_queue: int = 1024
    threads: int = 0

    def __post_init__(self) -> None:
        if not self.name:
            self.name = Path(self.path).stem
        if not re.fullmatch(r"[A-Za-z0-9_.\-]+", self.name):
            raise UsageError(f"model name {self.name!r} may hold only letters, digits, '_', '.' and '-' "
                             "(it is part of the URL); give another with --name")
        for attr, low in (("max_batch_size", 0), ("max_concurrency", 1), ("max_queue", 1), ("threads", 0)):
            v = getattr(self, attr)
            if not isinstance(v, int) or isinstance(v, bool) or v < low:
                raise UsageError(f"model {self.name!r}: {attr} must be an integer >= {low}, got {v!r}")
        for attr in ("max_queue_delay_ms", "timeout_s"):
            v = getattr(self, attr)
            if not isinstance(v, (int, float)) or isinstance(v, bool) or v < 0 or (attr == "timeout_s" and v == 0):
                raise UsageError(f"model {self.name!r}: {attr} must be a positive number, got {v!r}")
        if self.providers is not None and (not isinstance(self.providers, list)
                                           or not all(isinstance(p, str) for p in self.providers)):
            raise UsageError(f"model {self.name!r}: providers must be a list of provider names")


@dataclass
class ServerConfig:
    """The server: where it listens, the request size limit, and its models."""

    models: list = field(default_factory=list)
    host: str = "127.0.0.1"
    port: int = 8000
    max_request_bytes: int = 64 * 1024 * 1024
    graceful_timeout_s: float = 30.0

    def __post_init__(self) -> None:
        names = [m.name for m in self.models]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise UsageError(f"two models are named {dup[0]!r}; give each its own name with --name")


_MODEL_KEYS = {f.name for f in fields(ModelConfig)}
_SERVER_KEYS = {f.name for f in fields(ServerConfig)} - {"models"}


def load_config_file(path: str) -> tuple[dict, list[dict]]:
    """The server fields and the model entries of a JSON config file (paths made absolute)."""
    p = Path(path)
    try:
        raw = json.loads(p.read_text(encoding="utf-8"))
    except OSError as exc:
        raise UsageError(f"--config {path!r}: cannot read it: {exc.strerror or exc}") from None
    except ValueError as exc:
        raise UsageError(f"--config {path!r}: not valid JSON: {exc}") from None
    if not isinstance(raw, dict):
        raise UsageError(f"--config {path!r}: the file must hold a JSON object")
    unknown = sorted(set(raw) - _SERVER_KEYS - {"models"})
    if unknown:
        raise UsageError(f"--config {path!r}: unknown key {unknown[0]!r} (known: "
                         f"{', '.join(sorted(_SERVER_KEYS | {'models'}))})")
    models = raw.get("models", [])
    if not isinstance(models, list):
        raise UsageError(f"--config {path!r}: 'models' must be a list")
    entries = []
    for i, m in enumerate(models):
        if not isinstance(m, dict) or not isinstance(m.get("path"), str):
            raise UsageError(f"--config {path!r}: models[{i}] must be an object with a 'path'")
        bad = sorted(set(m) - _MODEL_KEYS)
        if bad:
            raise UsageError(f"--config {path!r}: models[{i}] has unknown key {bad[0]!r} "
                             f"(known: {', '.join(sorted(_MODEL_KEYS))})")
        m = dict(m)
        m["path"] = str((p.parent / m["path"]).resolve())
        entries.append(m)
    return {k: v for k, v in raw.items() if k != "models"}, entries
