"""`vision-gateway cluster`: `serve`'s flags (every one, forwarded to each replica's engine and
to the ingress as `serve` would use it) plus the cluster's own."""

from __future__ import annotations

import argparse
import importlib.util
import sys

from gateway.cluster.config import ClusterConfig
from gateway.config import ConfigError
from gateway.flags import (
    DefaultsFormatter,
    add_config_flags,
    add_serve_flags,
    build_config,
    configs_from_args,
    pool_from_args,
)
from gateway.server import bind_socket, check_models, resolve_model

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
    add_config_flags(p, ClusterConfig, "cluster")


def cluster_config(args: argparse.Namespace) -> ClusterConfig:
    """The cluster's settings from the parsed `cluster` flags (ConfigError when out of
    range)."""
    resources: dict[str, float] = {}
    for item in args.replica_resource or ():
        name, _, amount = item.partition("=")
        try:
            resources[name.strip()] = float(amount)
        except ValueError:
            raise ConfigError(f"--replica-resource {item!r}: expected NAME=AMOUNT") from None
    return build_config(ClusterConfig, args, replica_resources=resources)


def cluster(args: argparse.Namespace) -> None:
    """Run `vision-gateway cluster` from its parsed flags until SIGINT or SIGTERM. Raises
    ConfigError before starting anything when a value is out of range or the port is taken."""
    if importlib.util.find_spec("ray") is None:
        sys.exit(f"vision-gateway: `cluster` needs Ray Serve: {INSTALL_HINT}")
    settings = cluster_config(args)
    server, engine, media = configs_from_args(args)
    pool = pool_from_args(args)
    with bind_socket(server) as sock:  # before Ray and the model: a busy port fails at once
        engine, notice = resolve_model(engine)
        check_models(engine, pool)
        from gateway.cluster.launch import run_cluster

        run_cluster(settings, server, engine, media, notice, sock, pool)
