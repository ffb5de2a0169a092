"""Frozen configuration, built once at the edge (the CLI or a test) and validated there.

Nothing below the edge reads argv or the environment: it receives one of these.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

MIB = 1024 * 1024


class ConfigError(ValueError):
    """A configuration value is out of range; the message names the setting."""


def _require(ok: bool, message: str) -> None:
    if not ok:
        raise ConfigError(message)


@dataclass(frozen=True)
class MediaConfig:
    """Limits and permissions for loading images from URLs, data URIs and local paths."""

    allowed_media_dirs: tuple[Path, ...] = ()
    allow_private_urls: bool = False
    allowed_url_hosts: tuple[str, ...] = ()  # empty: any public host
    max_image_bytes: int = 20 * MIB
    max_image_pixels: int = 40_000_000  # per image, checked from the header before decoding
    max_request_pixels: int = 160_000_000  # all images of one request together
    max_images_per_request: int = 16
    connect_timeout_s: float = 5.0
    read_timeout_s: float = 15.0
    max_redirects: int = 3
    decode_memo_mb: int = 64  # encoded-bytes hash -> decoded image memo
    # Video (the `video_url` part): the encoded clip's size, its length, and how many frames
    # are sampled from it (at `video_fps` frames per second, spread evenly when the clip is
    # longer than max_video_frames / video_fps seconds).
    max_video_bytes: int = 64 * MIB
    max_video_seconds: float = 120.0
    max_video_frames: int = 32
    video_fps: float = 2.0

    def __post_init__(self) -> None:
        _require(self.max_image_bytes > 0, "--max-image-bytes must be > 0")
        _require(self.max_image_pixels > 0, "--max-image-pixels must be > 0")
        _require(self.max_video_bytes > 0, "--max-video-bytes must be > 0")
        _require(self.max_video_seconds > 0, "--max-video-seconds must be > 0")
        _require(1 <= self.max_video_frames <= 1024, "--max-video-frames must be in 1..1024")
        _require(0 < self.video_fps <= 60, "--video-fps must be in (0, 60]")
        _require(
            self.max_request_pixels >= self.max_image_pixels or self.max_request_pixels > 0,
            "--max-request-pixels must be > 0",
        )
        _require(self.max_images_per_request >= 0, "--max-images-per-request must be >= 0")
        _require(self.connect_timeout_s > 0 and self.read_timeout_s > 0, "timeouts must be > 0")
        _require(0 <= self.max_redirects <= 10, "--max-redirects must be in 0..10")
        _require(self.decode_memo_mb >= 0, "decode memo size must be >= 0")
        object.__setattr__(
            self,
            "allowed_media_dirs",
            tuple(Path(p).expanduser().resolve() for p in self.allowed_media_dirs),
        )
        object.__setattr__(
            self, "allowed_url_hosts", tuple(h.lower().rstrip(".") for h in self.allowed_url_hosts)
        )


GPU_KV_BLOCK_TOKENS = 256
CPU_KV_BLOCK_TOKENS = 32


@dataclass(frozen=True)
class CacheConfig:
    """Budgets for the content-addressed caches (bytes of used array size)."""

    vision_cache_mb: float = 512
    kv_cache_mb: float = 2048
    vision_enabled: bool = True
    prefix_enabled: bool = True
    # Exact KV reuse (docs/caching.md): every prompt position's KV is computed by a forward
    # over exactly one block of `kv_block_tokens` rows at a fixed absolute position (the last
    # block padded), in the cached and the uncached path alike, and only whole prefill-computed
    # blocks are reused. So a hit is bit-identical to no cache on any backend whose kernels
    # are deterministic for a given shape. The block is also the unit a block-structured KV
    # store would key on.
    exact_reuse: bool = True
    # 0: by device. A GPU forward of 256 rows costs about one of 32 (the weight read
    # dominates), so larger blocks there mean fewer forwards for a cold prompt; on a CPU every
    # padded row costs its own compute.
    kv_block_tokens: int = 0
    grammar_cache_mb: float = 64  # compiled structured-output grammars (estimated bytes)
    # The disk tier under both caches (docs/caching.md): None is off. The CLI defaults it to a
    # folder of the user cache dir; several servers may share one folder.
    cache_dir: Path | None = None
    disk_cache_gb: float = 10  # GiB for the whole folder (all models), files' sizes

    def __post_init__(self) -> None:
        _require(self.vision_cache_mb >= 0, "--vision-cache-mb must be >= 0")
        _require(self.kv_cache_mb >= 0, "--kv-cache-mb must be >= 0")
        _require(0 <= self.kv_block_tokens <= 4096, "--kv-block-tokens must be in 0..4096")
        _require(self.grammar_cache_mb >= 0, "--grammar-cache-mb must be >= 0")
        _require(self.disk_cache_gb >= 0, "--disk-cache-gb must be >= 0")
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
    def grammar_capacity_bytes(self) -> int:
        return int(self.grammar_cache_mb * MIB)


@dataclass(frozen=True)
class EngineConfig:
    """The model and how the one MLX thread schedules work."""

    model: str  # local directory or hub id
    served_model_name: str
    max_batch: int = 16  # rows decoding at once
    max_waiting: int = 64  # admitted-but-not-running requests before 429
    prefill_chunk_tokens: int = 512  # image prefill chunk between two decode steps
    default_max_tokens: int = 512
    max_context_tokens: int = 32768
    seed: int = 0
    mlx_cache_limit_mb: float | None = None  # MLX's pool of freed buffers; None: MLX default
    cache: CacheConfig = field(default_factory=CacheConfig)
    # cuDNN attention builds one plan per (query, key) length pair (tens of ms each); serving
    # meets new lengths on almost every request (prompts, turns, image grids), so MLX's own
    # attention kernels are used unless this is set.
    cudnn_attention: bool = False
    warmup: bool = True  # run synthetic requests at start-up, before /health says ready
    warmup_image_sizes: tuple[int, ...] = (448, 1024)  # square sizes (px) warmed at start-up
    step_trace: Path | None = None  # append one JSON line per engine step here (diagnostics)

    def __post_init__(self) -> None:
        _require(self.max_batch >= 1, "--max-batch must be >= 1")
        _require(self.max_waiting >= 0, "--max-waiting must be >= 0")
        _require(self.prefill_chunk_tokens >= 16, "--prefill-chunk must be >= 16")
        _require(self.default_max_tokens >= 1, "--default-max-tokens must be >= 1")
        _require(self.max_context_tokens >= 16, "--max-context must be >= 16")
        _require(
            all(16 <= s <= 4096 for s in self.warmup_image_sizes),
            "--warmup-image-size must be between 16 and 4096 pixels",
        )


@dataclass(frozen=True)
class ResponsesConfig:
    """Bounds of the Responses API's stored conversations (gateway.api.responses.store):
    `max_stored` 0 stores nothing (`previous_response_id` then always 404s); `ttl_s` 0: no
    expiry. Bytes count texts, rendered bodies and the kept decoded images (3 bytes/pixel)."""

    max_stored: int = 1000
    max_mb: float = 256
    ttl_s: float = 86400.0

    def __post_init__(self) -> None:
        _require(self.max_stored >= 0, "--responses-max-stored must be >= 0")
        _require(self.max_mb >= 0, "--responses-store-mb must be >= 0")
        _require(self.ttl_s >= 0, "--responses-ttl-s must be >= 0")

    @property
    def max_bytes(self) -> int:
        return int(self.max_mb * MIB)


@dataclass(frozen=True)
class ServerConfig:
    """The HTTP edge."""

    host: str = "127.0.0.1"
    port: int = 8000
    api_key: str | None = None
    metrics_api_key: str | None = None  # None: /metrics uses api_key
    # The OpenAI API's own payload limit (50 MB): larger bodies are refused before being read.
    max_body_bytes: int = 50_000_000
    # Bodies being read at once, all requests together: many large uploads together get a 429
    # (Retry-After) instead of exhausting memory.
    max_inflight_body_mb: float = 256
    shutdown_grace_s: float = 30.0
    log_level: str = "info"
    engine_process: bool = True  # run the engine in its own process (its own GIL)
    responses: ResponsesConfig = field(default_factory=ResponsesConfig)

    def __post_init__(self) -> None:
        _require(0 <= self.port <= 65535, "--port must be in 0..65535")
        _require(self.max_body_bytes > 0, "--max-body-bytes must be > 0")
        _require(
            self.max_inflight_body_mb * MIB >= self.max_body_bytes,
            "--max-inflight-body-mb must hold at least one body of --max-body-bytes",
        )
        _require(self.shutdown_grace_s >= 0, "--shutdown-grace must be >= 0")
