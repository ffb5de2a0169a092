"""`vision-gateway cluster`: `serve`'s flags (every one, forwarded to each replica's engine and
to the ingress as `serve` would use it) plus the cluster's own."""

from __future__ import annotations

import argparse
import importlib.util
import sys

from gateway.cluster.config import ClusterConfig
from gateway.config import ConfigError
from gateway.flags import DefaultsFormatter, add_serve_flags, configs_from_args
from gateway.server import bind_socket, resolve_model

_DEFAULTS = ClusterConfig()
# From a source checkout the package is not on an index: the editable install names the extra.
INSTALL_HINT = (
    "pip install -e '.[cluster]' in a source checkout, "
    "or pip install 'vision-gateway[cluster]' for an installed wheel"
)


def add_cluster_parser(sub: argparse._SubParsersAction) -> None:
    """`cluster` on the subcommands `sub`: every `serve` flag, then the cluster's own."""
    p = sub.add_parser(
        "cluster",
        help="run N engine replicas on Ray Serve behind one endpoint (affinity routing)",
        description="Serve the same API as `serve` over N engine replicas deployed on Ray "
        "Serve (a local Ray instance, or an existing cluster with --ray-address). Requests "
        "about the same image, and turns of one conversation, go to the same replica. "
        f"Every serve flag applies to every replica. Needs the `cluster` extra ({INSTALL_HINT}).",
        formatter_class=DefaultsFormatter,
    )
    add_serve_flags(p)
    a = p.add_argument_group("cluster").add_argument
    a("--replicas", type=int, default=_DEFAULTS.replicas, help="engine replicas")
    a(
        "--ray-address",
        default=None,
        help="join this Ray cluster ('auto': the one `ray start` made on this machine; or "
        "HOST:PORT); default: start a local Ray instance",
    )
    a(
        "--replica-cpus",
        type=float,
        default=_DEFAULTS.replica_cpus,
        help="logical CPUs each replica reserves in Ray",
    )
    a(
        "--replica-gpus",
        type=float,
        default=_DEFAULTS.replica_gpus,
        help="GPUs each replica reserves (1: one replica per GPU)",
    )
    a(
        "--replica-resource",
        action="append",
        default=[],
        metavar="NAME=AMOUNT",
        help="a custom Ray resource each replica reserves, e.g. mac=1 with nodes started as "
        "`ray start --resources '{\"mac\": 1}'` for one replica per Mac (repeatable)",
    )
    a(
        "--affinity-load-factor",
        type=float,
        default=_DEFAULTS.load_factor,
        help="a replica takes up to this times the mean in-flight load before a request's "
        "key spills to its next replica",
    )
    a(
        "--affinity-min-load",
        type=int,
        default=_DEFAULTS.min_load,
        help="... but always up to this many in flight (a replica batches them; a spill "
        "costs a cache miss)",
    )
    a(
        "--ray-num-cpus",
        type=int,
        default=_DEFAULTS.local_cpus,
        help="logical CPUs of a local Ray instance (0: this machine's, or what the replicas need)",
    )
    a(
        "--ray-object-store-mb",
        type=int,
        default=_DEFAULTS.object_store_mb,
        help="object store of a local Ray instance, MiB",
    )


def cluster_config(args: argparse.Namespace) -> ClusterConfig:
    resources: dict[str, float] = {}
    for item in args.replica_resource:
        name, _, amount = item.partition("=")
        try:
            resources[name.strip()] = float(amount)
        except ValueError:
            raise ConfigError(f"--replica-resource {item!r}: expected NAME=AMOUNT") from None
    return ClusterConfig(
        replicas=args.replicas,
        ray_address=args.ray_address,
        replica_cpus=args.replica_cpus,
        replica_gpus=args.replica_gpus,
        replica_resources=resources,
        load_factor=args.affinity_load_factor,
        min_load=args.affinity_min_load,
        local_cpus=args.ray_num_cpus,
        object_store_mb=args.ray_object_store_mb,
    )


def cluster(args: argparse.Namespace) -> None:
    """Run `vision-gateway cluster` from its parsed flags until SIGINT or SIGTERM. Raises
    ConfigError before starting anything when a value is out of range or the port is taken."""
    if importlib.util.find_spec("ray") is None:
        sys.exit(f"vision-gateway: `cluster` needs Ray Serve: {INSTALL_HINT}")
    settings = cluster_config(args)
    server, engine, media = configs_from_args(args)
    with bind_socket(server) as sock:  # before Ray and the model: a busy port fails at once
        engine, notice = resolve_model(engine)
        from gateway.cluster.launch import run_cluster

        run_cluster(settings, server, engine, media, notice, sock)
