"""`vision-gateway cluster`: start or join Ray, deploy one Serve application per replica slot
of each served model, and serve `serve`'s HTTP app over one `RoutedEngine` per model on this
machine (several models: each has `--replicas` replicas of its own, and the same affinity
routing among them; every model stays deployed, so each is pinned in the ingress's pool).

The ingress is not a Serve deployment: it is the same Starlette/uvicorn server `serve` runs
(same flags, auth, limits, errors, streaming, graceful shutdown), with the engine replaced by
the router over the replicas. Serve's own HTTP proxy is not started. On exit the replica
applications are deleted, and a Ray instance this command started is shut down.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import signal
import socket
from collections.abc import Callable, Sequence
from typing import Any

from gateway.cluster.config import ClusterConfig
from gateway.cluster.replica import EngineReplica
from gateway.config import EngineConfig, MediaConfig, ServerConfig
from gateway.pool_config import PoolConfig, engine_config_for

log = logging.getLogger(__name__)
# Settings a replica on another machine needs from this one's environment.
FORWARDED_ENV = ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_HOME", "VISION_GATEWAY_CACHE")


def start_ray(cluster: ClusterConfig, models: int = 1) -> bool:
    """Join `cluster.ray_address`, or start a small local Ray (CPUs for `models` x
    `--replicas` replicas); True if we started it."""
    import ray

    env = {k: os.environ[k] for k in FORWARDED_ENV if k in os.environ}
    common: dict[str, Any] = {
        "namespace": cluster.app_prefix,
        "runtime_env": {"env_vars": env} if env else None,
        "log_to_driver": True,
    }
    if cluster.ray_address:
        ray.init(address=cluster.ray_address, **common)
        return False
    needed = cluster.replicas * cluster.replica_cpus * models
    ray.init(
        num_cpus=cluster.local_cpus or max(os.cpu_count() or 1, int(needed + 0.999)),
        object_store_memory=cluster.object_store_mb * 2**20,
        include_dashboard=False,
        **common,
    )
    return True


def app_name(cluster: ClusterConfig, model: str | None, slot: int) -> str:
    """The Serve application of one replica slot (`model` None: the single-model name)."""
    return (
        f"{cluster.app_prefix}-{slot}" if model is None else f"{cluster.app_prefix}-{model}-{slot}"
    )


def deploy_replicas(
    cluster: ClusterConfig,
    engine: EngineConfig,
    engine_process: bool,
    log_level: str,
    model: str | None = None,
) -> list[Any]:
    """Deploy the replica slots of one model (`model`: its served name with several models,
    None with one) without waiting for it to load; their handles, in slot order. Each slot is
    its own application with one replica, which Serve replaces if it dies."""
    from ray import serve
    from ray.serve.api import _run

    serve.start(proxy_location="Disabled")  # the ingress is ours; no Serve HTTP proxy
    deployment = serve.deployment(EngineReplica)
    capacity = engine.max_batch + engine.max_waiting
    actor_options: dict[str, Any] = {"num_cpus": cluster.replica_cpus}
    if cluster.replica_gpus:
        actor_options["num_gpus"] = cluster.replica_gpus
    if cluster.replica_resources:
        actor_options["resources"] = dict(cluster.replica_resources)
    handles = []
    for slot in range(cluster.replicas):
        app = deployment.options(
            name="engine",
            num_replicas=1,
            max_ongoing_requests=capacity + 16,  # the router enforces capacity; calls on top
            ray_actor_options=actor_options,
            health_check_period_s=2.0,
            health_check_timeout_s=30.0,
            graceful_shutdown_timeout_s=5.0,
        ).bind(slot, engine, engine_process, log_level)
        name = app_name(cluster, model, slot)
        handles.append(_run(app, _blocking=False, name=name, route_prefix=None))
        log.info("replica %d deploying as Serve application %r", slot, name)
    return handles


def delete_replicas(cluster: ClusterConfig, models: Sequence[str | None] = (None,)) -> None:
    from ray import serve

    for model in models:
        for slot in range(cluster.replicas):
            name = app_name(cluster, model, slot)
            try:
                serve.delete(name, _blocking=True)
            except Exception as exc:  # noqa: BLE001 - best effort at exit
                log.warning("could not delete replica %s: %s", name, exc)


def run_cluster(
    cluster: ClusterConfig,
    server: ServerConfig,
    engine: EngineConfig,
    media: MediaConfig,
    notice: str | None,
    sock: socket.socket,
    pool: PoolConfig | None = None,
) -> None:
    """Run until SIGINT/SIGTERM: Ray, the replicas of each model (`pool`'s, or `engine`'s
    alone), and the ingress on `sock` (bound to server.host:port by
    `gateway.server.bind_socket`); then delete the replicas, stop a Ray this started, and
    return (a signalled shutdown is a clean exit, as `serve`'s is)."""
    from gateway.app import create_app
    from gateway.server import run_app

    pool = pinned_models(pool or PoolConfig())
    configs = {s.name: engine_config_for(s, engine) for s in pool.specs} or {None: engine}
    started = start_ray(cluster, len(configs))
    try:
        handles = {
            name: deploy_replicas(cluster, cfg, server.engine_process, server.log_level, name)
            for name, cfg in configs.items()
        }
        routed = _routed_engines(cluster, handles)
        # Replicas warm themselves up; the ingress has no engine of its own to warm.
        ingress_engine = dataclasses.replace(engine, warmup=False)
        app = create_app(
            server, ingress_engine, media, notice=notice, pool=pool, make_engine=routed
        )
        log.info(
            "cluster: %d model(s) x %d replicas, ingress on %s:%d",
            len(configs),
            cluster.replicas,
            server.host,
            server.port,
        )
        run_app(app, server, sock)
    except SystemExit as exc:
        # Outside the ingress's own handlers (Ray's start, the deployment) Ray's handler in
        # this driver turns SIGTERM into SystemExit(15): a stop asked for, not a failure.
        if exc.code != signal.SIGTERM:
            raise
        log.info("cluster: SIGTERM during start-up; stopping")
    finally:
        delete_replicas(cluster, list(configs))
        if started:
            import ray
            from ray import serve

            serve.shutdown()
            ray.shutdown()


def pinned_models(pool: PoolConfig) -> PoolConfig:
    """`pool` with every model pinned and no limits: each model's replicas are deployed for
    the whole run (unloading would only stop routing to replicas that still hold it)."""
    specs = tuple(dataclasses.replace(s, pinned=True) for s in pool.specs)
    return dataclasses.replace(pool, specs=specs, max_loaded=0, memory_gb=0.0)


def _routed_engines(
    cluster: ClusterConfig, handles: dict[str | None, list[Any]]
) -> Callable[[EngineConfig], Any]:
    """The ingress pool's engine factory: a `RoutedEngine` over the replicas of the model a
    config names (a new one per load: each has its own routing thread)."""
    from gateway.cluster.routed_engine import RoutedEngine
    from gateway.cluster.router import AffinityRouter

    def make(config: EngineConfig) -> Any:
        name = config.served_model_name if config.served_model_name in handles else None
        router = AffinityRouter(
            cluster.replicas,
            cluster.load_factor,
            capacity=config.max_batch + config.max_waiting,
            min_load=cluster.min_load,
        )
        return RoutedEngine(config, handles[name], router)

    return make
