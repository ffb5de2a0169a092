"""Frozen configuration, built once at the edge (the CLI or a test) and validated there.

Nothing below the edge reads argv or the environment: it receives one of these.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

# The flag machinery and MediaConfig live in their own modules; importable from here as before.
from gateway.config_fields import MIB as MIB
from gateway.config_fields import ConfigError as ConfigError
from gateway.config_fields import Flag as Flag
from gateway.config_fields import flag as flag
from gateway.config_fields import require as _require
from gateway.media_config import MediaConfig as MediaConfig
from gateway.tools.formats import PARSERS

TASKS = ("auto", "chat", "embed", "rerank")
GPU_KV_BLOCK_TOKENS = 256
CPU_KV_BLOCK_TOKENS = 32


@dataclass(frozen=True)
class CacheConfig:
    """Budgets for the content-addressed caches (bytes of used array size)."""

    vision_cache_mb: float = flag("--vision-cache-mb", "vision-feature cache budget, MiB", 512)
    kv_cache_mb: float = flag("--kv-cache-mb", "KV prefix cache budget, MiB", 2048)
    embedding_cache_mb: float = flag(
        "--embedding-cache-mb",
        "embedding models: finished-vector cache budget, MiB (0 disables it)",
        64,
    )
    vision_enabled: bool = flag(
        "--no-vision-cache", "disable the vision-feature cache", True, kind="off"
    )
    prefix_enabled: bool = flag(
        "--no-prefix-cache", "disable the KV prefix cache", True, kind="off"
    )
    # Exact KV reuse (docs/caching.md): every prompt position's KV is computed by a forward
    # over exactly one block of `kv_block_tokens` rows at a fixed absolute position (the last
    # block padded), in the cached and the uncached path alike, and only whole prefill-computed
    # blocks are reused. So a hit is bit-identical to no cache on any backend whose kernels
    # are deterministic for a given shape. The block is also the unit a block-structured KV
    # store would key on.
    exact_reuse: bool = flag(
        "--exact-cache",
        "compute and reuse KV in fixed blocks so a cache hit is bit-identical to no cache on "
        "every backend (docs/caching.md); --no-exact-cache reuses any prefix",
        True,
        kind="both",
    )
    # 0: by device. A GPU forward of 256 rows costs about one of 32 (the weight read
    # dominates), so larger blocks there mean fewer forwards for a cold prompt; on a CPU every
    # padded row costs its own compute.
    kv_block_tokens: int = flag(
        "--kv-block-tokens",
        "block size (tokens) of --exact-cache: prefill forwards and KV reuse granularity; "
        "0: 256 on a GPU, 32 on CPU",
        0,
    )
    # After an answer ends, prefill its whole blocks exactly in spare time and store them, so
    # the next turn reuses prompt + answer (gateway/engine/scheduler/answer_store.py).
    answer_prefill: bool = flag(
        "--answer-prefill",
        "after an answer ends, recompute its KV in exact prefill blocks in idle time (while "
        "rows decode: blocks of at most a quarter of a decode step) and store it, so the next "
        "turn reuses prompt + answer; "
        "--no-answer-prefill: only the prompt is stored (docs/caching.md)",
        True,
        kind="both",
    )
    # Quantized KV (docs/caching.md, "Quantized KV"): a hit stays exact, since cached and
    # uncached requests quantize the same rows, computed the same way.
    kv_bits: int = flag(
        "--kv-bits",
        "hold the KV cache (running rows, the prefix cache, its disk tier) quantized to 8 or 4 "
        "bits: about 2x / 4x the cached tokens per byte; 0: the model's own dtype",
        0,
        choices=(0, 4, 8),
    )
    kv_group_size: int = flag(
        "--kv-group-size",
        "channels per scale and bias of --kv-bits (a head's width must be a multiple)",
        64,
        choices=(32, 64, 128),
    )
    grammar_cache_mb: float = flag(  # compiled structured-output grammars (estimated bytes)
        "--grammar-cache-mb",
        "compiled structured-output grammars cache budget, MiB (estimated sizes)",
        64,
    )
    # The disk tier under both caches (docs/caching.md): None is off. The CLI defaults it to a
    # folder of the user cache dir; several servers may share one folder.
    cache_dir: Path | None = flag(
        "--cache-dir",
        "folder of the disk tier under both caches (vision features and KV blocks survive "
        "restarts; several servers may share it); default: disk-cache/ in the user cache dir "
        "($VISION_GATEWAY_CACHE, else $XDG_CACHE_HOME/vision-gateway, else "
        "~/.cache/vision-gateway)",
        None,
        off="--no-disk-cache",
        off_help="no disk tier: the caches live in memory only",
    )
    disk_cache_gb: float = flag(  # GiB for the whole folder (all models), files' sizes
        "--disk-cache-gb",
        "disk tier budget for the whole --cache-dir, GiB; least recently used files go",
        10,
    )
    # Folders 0700 and files 0600 by default (docs/security.md); a folder others can write
    # to is refused unless its group is meant to share it.
    cache_dir_group: bool = flag(
        "--cache-dir-group",
        "let the --cache-dir folder's group share it (folders 2770, files 0660; a "
        "group-writable folder is then accepted): several servers of one group on one folder",
        False,
        kind="on",
    )
    # One tenant (API key name) may hold at most this part of each memory cache's budget, so
    # it cannot evict every other tenant; the shared scope is not limited.
    tenant_cache_share: float = flag(
        "--tenant-cache-share",
        "part of each memory cache's budget one tenant may hold (0 < share <= 1), so one "
        "tenant cannot evict everyone else",
        0.5,
    )

    def __post_init__(self) -> None:
        # (an upper bound too: 1e308 GiB is finite but no byte count)
        _require(0 <= self.vision_cache_mb <= 2**30, "--vision-cache-mb must be in 0..2^30")
        _require(0 <= self.kv_cache_mb <= 2**30, "--kv-cache-mb must be in 0..2^30")
        _require(0 <= self.embedding_cache_mb <= 2**30, "--embedding-cache-mb must be in 0..2^30")
        _require(0 <= self.kv_block_tokens <= 4096, "--kv-block-tokens must be in 0..4096")
        _require(0 <= self.grammar_cache_mb <= 2**30, "--grammar-cache-mb must be in 0..2^30")
        _require(0 <= self.disk_cache_gb <= 2**30, "--disk-cache-gb must be in 0..2^30")
        _require(0 < self.tenant_cache_share <= 1, "--tenant-cache-share must be in (0, 1]")
        _require(self.kv_bits in (0, 4, 8), "--kv-bits must be 0, 4 or 8")
        _require(self.kv_group_size in (32, 64, 128), "--kv-group-size must be 32, 64 or 128")
        if self.cache_dir is not None:
            object.__setattr__(self, "cache_dir", Path(self.cache_dir).expanduser())

    def exact_block_tokens(self, on_gpu: bool) -> int:
        """The block size of the exact-reuse rule on this device, 0 when the rule is off."""
        if not self.exact_reuse:
            return 0
        return self.kv_block_tokens or (GPU_KV_BLOCK_TOKENS if on_gpu else CPU_KV_BLOCK_TOKENS)

    @property
    def vision_capacity_bytes(self) -> int:
        return int(self.vision_cache_mb * MIB) if self.vision_enabled else 0

    @property
    def kv_capacity_bytes(self) -> int:
        return int(self.kv_cache_mb * MIB) if self.prefix_enabled else 0

    @property
    def disk_capacity_bytes(self) -> int:
        """0 when the disk tier is off (no folder or no budget)."""
        return int(self.disk_cache_gb * 2**30) if self.cache_dir is not None else 0

    @property
    def embedding_capacity_bytes(self) -> int:
        return int(self.embedding_cache_mb * MIB)

    @property
    def grammar_capacity_bytes(self) -> int:
        return int(self.grammar_cache_mb * MIB)


@dataclass(frozen=True)
class EngineConfig:
    """The model and how the one MLX thread schedules work."""

    # A local directory or hub id; its flag, `--model`, is `PoolConfig.model_args` (several
    # models: gateway.pool_config).
    model: str
    served_model_name: str = flag(
        "--served-model-name", "model name clients send (default: derived from --model)"
    )
    max_batch: int = flag("--max-batch", "rows decoding at once", 16)
    max_waiting: int = flag(  # admitted-but-not-running requests before 429
        "--max-waiting",
        "requests queued beyond the running rows; more are refused (429, or 529 on /v1/messages)",
        64,
    )
    prefill_chunk_tokens: int = flag(  # image prefill chunk between two decode steps
        "--prefill-chunk", "tokens per prefill chunk between decodes", 512
    )
    admission_budget: float = flag(  # gateway.engine.scheduler.budget
        "--admission-budget",
        "while rows decode, image work per engine step (vision-tower units + prefill) as a "
        "multiple of the measured decode step; 0: one tower unit and one prefill chunk per step",
        2.0,
    )
    default_max_tokens: int = flag(
        "--default-max-tokens",
        "tokens to generate at most when a request sets no max_tokens (bounded by the context)",
        512,
    )
    # 0: the checkpoint's own context bounded by memory (gateway.frontend.context decides
    # once the model is loaded); a request's max_tokens is capped to the room its prompt
    # leaves in it.
    max_context_tokens: int = flag(
        "--max-context",
        "prompt + completion tokens; 0: the checkpoint's own context (max_position_embeddings), "
        "bounded by the memory left for one row's KV after the weights and cache budgets",
        0,
    )
    tool_call_parser: str = flag(  # the tool-call syntax; auto: read from the chat template
        "--tool-call-parser",
        "tool-call syntax: auto (from the chat template), hermes, llama3_json, none (off)",
        "auto",
        choices=PARSERS,
    )
    # What the model serves (processors/checkpoint.serving_task): auto reads the checkpoint
    # (an embedding model embeds, anything else chats); a reranker is a chat checkpoint
    # (Qwen3-Reranker) that nothing in its files tells apart, so it is asked for.
    task: str = flag(
        "--task",
        "what the model serves: auto (from its checkpoint: an embedding model embeds, any "
        "other chats), chat, embed, or rerank (a Qwen3 checkpoint scoring yes/no, as "
        "Qwen3-Reranker: /v1/rerank)",
        "auto",
        choices=TASKS,
    )
    seed: int = 0
    mlx_cache_limit_mb: float | None = flag(  # MLX's pool of freed buffers; None: MLX default
        "--mlx-cache-limit-mb",
        "cap MLX's pool of freed buffers (MiB); default: MLX's own limit",
        None,
    )
    cache: CacheConfig = field(default_factory=CacheConfig)
    # cuDNN attention builds one plan per (query, key) length pair (tens of ms each); serving
    # meets new lengths on almost every request (prompts, turns, image grids), so MLX's own
    # attention kernels are used unless this is set.
    admission_stream: bool = flag(  # gateway.engine.core: Engine.step
        "--admission-stream",
        "run each step's image work (prefill, vision tower, answer prefill) on an MLX stream of "
        "its own, after the decode, so running streams do not wait for it (experimental)",
        False,
        kind="on",
    )
    cudnn_attention: bool = flag(
        "--cudnn-attention",
        "use cuDNN attention on CUDA (fast for repeated shapes; plans a new one per length)",
        False,
        kind="on",
    )
    warmup: bool = flag(  # run synthetic requests at start-up, before /health says ready
        "--no-warmup",
        "skip the start-up warm-up (the first requests then pay for kernel compilation)",
        True,
        kind="off",
    )
    warmup_image_sizes: tuple[int, ...] = flag(  # square sizes (px) warmed at start-up
        "--warmup-image-size",
        "square image size to warm up at start-up (repeatable; default: {default})",
        (448, 1024),
        kind="list",
        metavar="PX",
    )
    step_trace: Path | None = flag(  # append one JSON line per engine step here (diagnostics)
        "--step-trace",
        "append one JSON line per engine step to FILE (stage times, rows; diagnostics)",
        None,
        metavar="FILE",
    )

    def __post_init__(self) -> None:
        _require(self.max_batch >= 1, "--max-batch must be >= 1")
        _require(self.max_waiting >= 0, "--max-waiting must be >= 0")
        _require(self.prefill_chunk_tokens >= 16, "--prefill-chunk must be >= 16")
        _require(0 <= self.admission_budget <= 1000, "--admission-budget must be in 0..1000")
        _require(self.default_max_tokens >= 1, "--default-max-tokens must be >= 1")
        _require(
            self.max_context_tokens == 0 or self.max_context_tokens >= 16,
            "--max-context must be 0 (the checkpoint's own) or >= 16",
        )
        _require(
            all(16 <= s <= 4096 for s in self.warmup_image_sizes),
            "--warmup-image-size must be between 16 and 4096 pixels",
        )
        limit = self.mlx_cache_limit_mb
        _require(limit is None or 0 <= limit <= 2**30, "--mlx-cache-limit-mb must be in 0..2^30")
        trace = self.step_trace
        _require(
            trace is None or not Path(trace).is_dir(),
            f"--step-trace {trace}: is a folder; name a file to append the trace to",
        )


@dataclass(frozen=True)
class ResponsesConfig:
    """Bounds of the Responses API's stored conversations (gateway.api.responses.store):
    `max_stored` 0 stores nothing (`previous_response_id` then always 404s); `ttl_s` 0: no
    expiry. Bytes count texts, rendered bodies and the kept decoded images (3 bytes/pixel)."""

    max_stored: int = flag(
        "--responses-max-stored",
        "Responses API: stored responses kept for previous_response_id (LRU; 0: none)",
        1000,
    )
    max_mb: float = flag(
        "--responses-store-mb",
        "Responses API: MiB for stored conversations, their decoded images included",
        256,
    )
    ttl_s: float = flag(
        "--responses-ttl-s",
        "Responses API: seconds a stored response is kept (0: until evicted)",
        86400.0,
    )

    def __post_init__(self) -> None:
        _require(self.max_stored >= 0, "--responses-max-stored must be >= 0")
        _require(0 <= self.max_mb <= 2**30, "--responses-store-mb must be in 0..2^30")
        _require(self.ttl_s >= 0, "--responses-ttl-s must be >= 0")

    @property
    def max_bytes(self) -> int:
        return int(self.max_mb * MIB)


@dataclass(frozen=True)
class ServerConfig:
    """The HTTP edge."""

    host: str = flag("--host", "bind address", "127.0.0.1")
    port: int = flag("--port", "TCP port", 8000)
    api_key: str | None = flag(
        "--api-key",
        "require the key as `Authorization: Bearer KEY` or `x-api-key: KEY` "
        "(env VISION_GATEWAY_API_KEY)",
        None,
        env="VISION_GATEWAY_API_KEY",
    )
    # Several keys, one per tenant: `name key` lines; reread on SIGHUP.
    api_keys_file: Path | None = flag(
        "--api-keys-file",
        "a file of `NAME KEY` lines, one API key per tenant (NAME: letters, digits, _ . -); "
        "reread on SIGHUP; --api-key adds a tenant named 'default'",
        None,
        metavar="FILE",
    )
    # The operator's key: cache clear, every cache entry, the dashboard's data, /metrics.
    # None: with a single key (or none) that key is the admin, else nobody is.
    admin_api_key: str | None = flag(
        "--admin-api-key",
        "key for /v1/cache/clear, all of /v1/cache/entries, /v1/dashboard and /metrics "
        "(env VISION_GATEWAY_ADMIN_API_KEY; default: the only key when there is one)",
        None,
        env="VISION_GATEWAY_ADMIN_API_KEY",
    )
    metrics_api_key: str | None = flag(  # the old name of admin_api_key, folded into it
        "--metrics-api-key",
        "old name of --admin-api-key (env VISION_GATEWAY_METRICS_API_KEY)",
        None,
        env="VISION_GATEWAY_METRICS_API_KEY",
    )
    # Which requests may share cache entries: "tenant" keeps each key's entries its own.
    cache_scope: str = flag(
        "--cache-scope",
        "share cache entries between tenants (shared) or not (tenant); auto: tenant when "
        "more than one key is configured. `cache_salt` in a request scopes further",
        "auto",
        choices=("auto", "tenant", "shared"),
    )
    # The OpenAI API's own payload limit (50 MB): larger bodies are refused before being read.
    max_body_bytes: int = flag(
        "--max-body-bytes",
        "request body cap, bytes (413 over it, checked before the body is read whole)",
        50_000_000,
    )
    # Bodies being read at once, all requests together: many large uploads together get a 429
    # (Retry-After) instead of exhausting memory.
    max_inflight_body_mb: float = flag(
        "--max-inflight-body-mb",
        "request bodies being read at once, all requests together, MiB (over it: 429)",
        256,
    )
    shutdown_grace_s: float = flag("--shutdown-grace", "seconds to finish running requests", 30.0)
    log_level: str = flag(
        "--log-level",
        "log level of the server and the engine process",
        "info",
        choices=("debug", "info", "warning", "error"),
    )
    # uvicorn's event loop: "auto" is uvloop when it is installed, else asyncio.
    loop: str = flag(
        "--loop",
        "event loop of the HTTP server (auto: uvloop when installed, else asyncio)",
        "auto",
        choices=("auto", "asyncio", "uvloop"),
    )
    engine_process: bool = flag(  # run the engine in its own process (its own GIL)
        "--in-process-engine",
        "run the engine thread inside the HTTP process (one GIL: slower on a GPU)",
        True,
        kind="off",
    )
    responses: ResponsesConfig = field(default_factory=ResponsesConfig)

    def __post_init__(self) -> None:
        _require(0 <= self.port <= 65535, "--port must be in 0..65535")
        _require(self.max_body_bytes > 0, "--max-body-bytes must be > 0")
        _require(self.max_inflight_body_mb <= 2**30, "--max-inflight-body-mb must be <= 2^30")
        _require(
            self.max_inflight_body_mb * MIB >= self.max_body_bytes,
            "--max-inflight-body-mb must hold at least one body of --max-body-bytes",
        )
        _require(self.shutdown_grace_s >= 0, "--shutdown-grace must be >= 0")
        _require(
            self.cache_scope in ("auto", "tenant", "shared"),
            "--cache-scope must be auto, tenant or shared",
        )
        for name, key in (("--api-key", self.api_key), ("--admin-api-key", self.admin_api_key),
                          ("--metrics-api-key", self.metrics_api_key)):  # fmt: skip
            # `--api-key "$KEY"` with KEY unset: serving with no authentication would be silent
            _require(
                key is None or key.strip() != "",
                f"{name} (or its environment variable) is empty: an unset variable?",
            )
        old, new = self.metrics_api_key, self.admin_api_key
        _require(
            old is None or new is None or old == new,
            "--metrics-api-key is the old name of --admin-api-key: give one of them",
        )
        object.__setattr__(self, "admin_api_key", new or old)
        object.__setattr__(self, "metrics_api_key", new or old)
        if self.api_keys_file is not None:
            object.__setattr__(self, "api_keys_file", Path(self.api_keys_file).expanduser())
