"""The cluster command's own settings (everything else is `serve`'s configuration, passed to
every replica unchanged). Each field with a flag declares it here (`gateway.config.flag`)."""

from __future__ import annotations

from dataclasses import dataclass

from gateway.config import ConfigError, flag


@dataclass(frozen=True)
class ClusterConfig:
    """How many replicas, where Ray is, and what each replica reserves there.

    ray_address None: start a local Ray instance (this machine only) with `local_cpus`
    logical CPUs (0: enough for the replicas) and `object_store_mb` of object store;
    "auto" or "HOST:PORT": join the cluster `ray start` made. Each replica reserves
    `replica_cpus`, `replica_gpus` and `replica_resources` (custom resources, e.g. one
    `mac` per Mac node) so Ray places one per GPU or per machine.
    """

    replicas: int = flag("--replicas", "engine replicas", 2)
    ray_address: str | None = flag(
        "--ray-address",
        "join this Ray cluster ('auto': the one `ray start` made on this machine; or "
        "HOST:PORT); default: start a local Ray instance",
        None,
    )
    replica_cpus: float = flag("--replica-cpus", "logical CPUs each replica reserves in Ray", 1.0)
    replica_gpus: float = flag(
        "--replica-gpus", "GPUs each replica reserves (1: one replica per GPU)", 0.0
    )
    # From NAME=AMOUNT items (`gateway.cluster.cli.cluster_config`).
    replica_resources: dict[str, float] = flag(
        "--replica-resource",
        "a custom Ray resource each replica reserves, e.g. mac=1 with nodes started as "
        "`ray start --resources '{\"mac\": 1}'` for one replica per Mac (repeatable)",
        factory=dict,
        kind="list",
        metavar="NAME=AMOUNT",
    )
    load_factor: float = flag(
        "--affinity-load-factor",
        "a replica takes up to this times the mean in-flight load before a request's key "
        "spills to its next replica",
        1.25,
    )
    min_load: int = flag(  # the load bound's floor (`gateway.cluster.router`)
        "--affinity-min-load",
        "... but always up to this many in flight (a replica batches them; a spill costs a "
        "cache miss)",
        4,
    )
    local_cpus: int = flag(
        "--ray-num-cpus",
        "logical CPUs of a local Ray instance (0: this machine's, or what the replicas need)",
        0,
    )
    object_store_mb: int = flag(
        "--ray-object-store-mb", "object store of a local Ray instance, MiB", 256
    )
    app_prefix: str = "vision-gateway"

    def __post_init__(self) -> None:
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
