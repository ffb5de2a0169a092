"""What a client-side bench measures: our server started here, or any OpenAI-compatible URL.

`--base-url URL --model NAME` points a scenario at a server started elsewhere (ours, mlx-vlm's,
vllm-mlx, vLLM, llama.cpp): the same client, the same requests. Features that only our server
has are probed, never assumed: `Server-Timing` and `x-cache` headers, `/v1/cache/stats`,
`/v1/cache/clear`, `/metrics` with `vision_gateway_*` samples. A scenario that uses one of them
degrades to what the target offers (the figure becomes n/a) and says so in its output.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

import httpx


@dataclass
class RemoteTarget:
    """An OpenAI-compatible server at `base_url` (no `/v1`), not started or stopped by us.

    Same interface as `LocalServer` for what the benches use: `base_url`, `client()`,
    `metrics()` ({} when the target has no Prometheus endpoint), `pid_rss_bytes()` (the
    `server_pid`'s RSS when given and on this machine, else 0), `stop()` (a no-op: None).
    """

    base_url: str
    api_key: str = "unused"
    server_pid: int | None = None

    def __post_init__(self) -> None:
        self.base_url = self.base_url.rstrip("/").removesuffix("/v1")

    def client(self, **kwargs: Any) -> Any:
        from openai import OpenAI

        kwargs.setdefault("api_key", self.api_key)
        return OpenAI(base_url=self.base_url + "/v1", max_retries=0, timeout=600, **kwargs)

    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"}

    def metrics(self, headers: dict[str, str] | None = None) -> dict[str, float]:
        """Prometheus samples by name, or {} when /metrics is missing or not Prometheus."""
        try:
            r = httpx.get(self.base_url + "/metrics", timeout=10, headers=headers or self.headers())
        except httpx.HTTPError:
            return {}
        out: dict[str, float] = {}
        if r.status_code != 200:
            return out
        for line in r.text.splitlines():
            if line and not line.startswith("#"):
                name, _, value = line.rpartition(" ")
                try:
                    out[name] = float(value)
                except ValueError:
                    return {}  # not Prometheus text
        return out

    def pid_rss_bytes(self) -> int:
        if self.server_pid is None:
            return 0
        try:
            import os

            fields = Path(f"/proc/{self.server_pid}/statm").read_text().split()
            return int(fields[1]) * os.sysconf("SC_PAGE_SIZE")
        except (OSError, ValueError):
            return 0

    def stop(self, timeout: float = 0.0) -> None:
        return None


@dataclass(frozen=True)
class Backend:
    """What answered: recorded with every result. `ours` enables our headers and endpoints."""

    name: str  # "vision-gateway", or the label/owner the target reports
    version: str
    ours: bool
    model: str  # the model name requests carry
    base_url: str
    details: dict[str, Any] = field(default_factory=dict)  # /v1/models card, server header


def describe(target: Any, model: str, label: str | None = None) -> Backend:
    """Probe `target` (GET /v1/models, /v1/cache/stats) for what it is. `label` (e.g.
    "mlx-vlm 0.7.10") names a peer whose responses do not say."""
    headers = _auth(target)
    details: dict[str, Any] = {}
    try:
        r = httpx.get(target.base_url + "/v1/models", timeout=10, headers=headers)
        details["server_header"] = r.headers.get("server", "")
        cards = r.json().get("data", []) if r.status_code == 200 else []
        card = next((c for c in cards if c.get("id") == model), cards[0] if cards else {})
        details["model_card"] = {k: card.get(k) for k in ("id", "owned_by", "root") if k in card}
    except (httpx.HTTPError, ValueError, AttributeError):
        card = {}
    ours = card.get("owned_by") == "vision-gateway" and _has_cache_stats(target, headers)
    if ours:
        name, version = "vision-gateway", _version("vision-gateway")
    else:
        name, _, version = (label or card.get("owned_by") or "unknown").partition(" ")
    if label and ours:
        name, _, version = label.partition(" ")
    return Backend(name, version or "?", ours, model, target.base_url, details)


def _has_cache_stats(target: Any, headers: dict[str, str]) -> bool:
    try:
        r = httpx.get(target.base_url + "/v1/cache/stats", timeout=10, headers=headers)
        return r.status_code == 200 and "vision" in r.json()
    except (httpx.HTTPError, ValueError):
        return False


def _version(package: str) -> str:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return "?"


def cache_stats(target: Any, backend: Backend) -> dict[str, Any] | None:
    """Our `/v1/cache/stats` (None for other servers)."""
    if not backend.ours:
        return None
    try:
        url = target.base_url + "/v1/cache/stats"
        return httpx.get(url, timeout=30, headers=_auth(target)).json()
    except (httpx.HTTPError, ValueError):
        return None


def clear_caches(target: Any, backend: Backend) -> bool:
    """Empty our caches so the first figures are cold; False (nothing done) elsewhere: other
    servers get new pixels and new prompts for every cold request instead."""
    if not backend.ours:
        return False
    r = httpx.post(target.base_url + "/v1/cache/clear", timeout=60, headers=_auth(target))
    return r.status_code == 200


def _auth(target: Any) -> dict[str, str]:
    return {"Authorization": f"Bearer {getattr(target, 'api_key', 'unused')}"}


def model_facts(model_path: str | None) -> dict[str, Any]:
    """Architecture and dtype from a local checkpoint's config.json ({} for a hub id or a
    remote server's model we cannot read)."""
    if not model_path or not (Path(model_path) / "config.json").is_file():
        return {}
    config = json.loads((Path(model_path) / "config.json").read_text())
    text = config.get("text_config") or {}
    return {
        "path": str(model_path),
        "architecture": config.get("model_type"),
        "dtype": config.get("torch_dtype") or text.get("torch_dtype") or text.get("dtype"),
        "hidden_size": config.get("hidden_size") or text.get("hidden_size"),
        "layers": config.get("num_hidden_layers") or text.get("num_hidden_layers"),
        "quantization": config.get("quantization"),
    }


def quiet_clients() -> None:
    """The benches make thousands of requests: keep httpx's per-request INFO lines out."""
    for name in ("httpx", "httpx2", "openai"):
        logging.getLogger(name).setLevel(logging.WARNING)


def local_model(args: argparse.Namespace) -> str:
    """The checkpoint our server (or engine) loads: `--model`, else the embedded tiny model
    (built offline on first use, printing its progress)."""
    quiet_clients()
    if args.model:
        return args.model
    from gateway.offline_model import ensure_model

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    return str(ensure_model(progress=lambda m: print(f"embedded model: {m}")))


@contextlib.contextmanager
def open_target(args: argparse.Namespace, extra: list[str] | None = None) -> Iterator[Any]:
    """(target, backend, model facts): our server started here with `extra` and
    `--server-arg` flags (stopped on exit), or `--base-url`'s (left running)."""
    quiet_clients()
    if args.base_url:
        if not args.model:
            raise SystemExit("--base-url needs --model NAME (the model name requests carry)")
        target = RemoteTarget(args.base_url, args.api_key, args.server_pid)
        facts = model_facts(str(getattr(args, "raw_model", None) or ""))
        yield target, describe(target, args.model, args.backend_label), facts
        return
    from bench.server import LocalServer

    model = local_model(args)
    print(f"starting vision-gateway serve --model {model}", flush=True)
    server = LocalServer(
        ["--model", model, "--served-model-name", "bench", *(extra or []), *args.server_arg]
    )
    try:
        yield server, describe(server, "bench", args.backend_label), model_facts(model)
    finally:
        server.stop()
