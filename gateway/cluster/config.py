"""The cluster command's own settings (everything else is `serve`'s configuration, passed to
every replica unchanged)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class ClusterConfig:
    """How many replicas, where Ray is, and what each replica reserves there.

    ray_address None: start a local Ray instance (this machine only) with `local_cpus`
    logical CPUs (0: enough for the replicas) and `object_store_mb` of object store;
    "auto" or "HOST:PORT": join the cluster `ray start` made. Each replica reserves
    `replica_cpus`, `replica_gpus` and `replica_resources` (custom resources, e.g. one
    `mac` per Mac node) so Ray places one per GPU or per machine.
    """

    replicas: int = 2
    ray_address: str | None = None
    replica_cpus: float = 1.0
    replica_gpus: float = 0.0
    replica_resources: dict[str, float] = field(default_factory=dict)
    load_factor: float = 1.25
    min_load: int = 4  # the load bound's floor (`gateway.cluster.router`)
    local_cpus: int = 0
    object_store_mb: int = 256
    app_prefix: str = "vision-gateway"

    def __post_init__(self) -> None:
        from gateway.config import ConfigError

        if not 1 <= self.replicas <= 256:
            raise ConfigError("--replicas must be in 1..256")
        if self.replica_cpus < 0 or self.replica_gpus < 0:
            raise ConfigError("--replica-cpus and --replica-gpus must be >= 0")
        if any(v <= 0 for v in self.replica_resources.values()):
            raise ConfigError("--replica-resource amounts must be > 0")
        if self.load_factor < 1:
            raise ConfigError("--affinity-load-factor must be >= 1")
        if self.min_load < 1:
            raise ConfigError("--affinity-min-load must be >= 1")
        if self.object_store_mb < 64:
            raise ConfigError("--ray-object-store-mb must be >= 64")
