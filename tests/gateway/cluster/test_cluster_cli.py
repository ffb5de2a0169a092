"""`vision-gateway cluster` takes every `serve` flag (forwarded to each replica) plus its own."""

from __future__ import annotations

import argparse
import importlib.util
import socket

import pytest

from gateway.cli import build_parser
from gateway.cluster.cli import cluster, cluster_config
from gateway.cluster.config import ClusterConfig
from gateway.config import ConfigError
from gateway.flags import configs_from_args, flagged_fields


def _subparser(name: str) -> argparse.ArgumentParser:
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return sub.choices[name]


def _options(parser: argparse.ArgumentParser) -> set[str]:
    return {o for a in parser._actions for o in a.option_strings}


def test_every_serve_flag_is_a_cluster_flag():
    """A flag added to `serve` (e.g. the disk tier's) is accepted by `cluster` as well."""
    serve, cluster = _options(_subparser("serve")), _options(_subparser("cluster"))
    assert serve <= cluster
    assert {"--replicas", "--ray-address", "--replica-gpus", "--replica-resource"} <= cluster


def test_serve_flags_reach_the_engine_config_and_cluster_flags_their_own():
    """Engine and cache flags land in the EngineConfig every replica gets; the cluster's
    flags in ClusterConfig."""
    args = build_parser().parse_args(
        [
            "cluster",
            "--replicas",
            "3",
            "--kv-cache-mb",
            "100",
            "--max-batch",
            "4",
            "--replica-resource",
            "mac=1",
            "--replica-gpus",
            "1",
            "--ray-address",
            "auto",
        ]
    )
    _, engine, _ = configs_from_args(args)
    assert engine.cache.kv_cache_mb == 100 and engine.max_batch == 4
    settings = cluster_config(args)
    assert settings.replicas == 3 and settings.replica_resources == {"mac": 1.0}
    assert settings.replica_gpus == 1 and settings.ray_address == "auto"


@pytest.mark.parametrize(
    "flags",
    [
        ["--replicas", "0"],
        ["--replica-resource", "mac"],
        ["--affinity-load-factor", "0.5"],
        ["--affinity-min-load", "0"],
    ],
)
def test_bad_cluster_flags_are_config_errors(flags):
    """Out-of-range cluster settings are refused with a message naming the flag."""
    args = build_parser().parse_args(["cluster", *flags])
    with pytest.raises(ConfigError, match="--"):
        cluster_config(args)


@pytest.mark.skipif(importlib.util.find_spec("ray") is None, reason="needs the cluster extra")
def test_a_busy_port_fails_before_ray_starts(monkeypatch: pytest.MonkeyPatch) -> None:
    """Invariant: `cluster` binds its port before Ray and the model: a port in use is a
    ConfigError naming it, and nothing is launched."""
    import gateway.cluster.launch as launch

    monkeypatch.setattr(launch, "start_ray", lambda *a: pytest.fail("Ray was started"))
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        args = build_parser().parse_args(["cluster", "--port", str(port)])
        with pytest.raises(ConfigError, match=f"--port {port}: .* already in use"):
            cluster(args)


def test_the_install_hint_works_from_a_checkout(capsys: pytest.CaptureFixture[str]) -> None:
    """The `cluster` extra's hint names the editable install (a checkout is not on an index)
    and the package form for an installed wheel."""
    with pytest.raises(SystemExit):
        build_parser().parse_args(["cluster", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "pip install -e '.[cluster]'" in text and "'vision-gateway[cluster]'" in text


def test_cluster_flags_are_declared_on_cluster_config_fields():
    """The cluster's own flags are generated from ClusterConfig's field metadata, as serve's
    are from the serve configs: each declared once, the default being the field's."""
    own = _options(_subparser("cluster")) - _options(_subparser("serve"))
    assert own == {spec.name for _, spec in flagged_fields(ClusterConfig)}
    assert cluster_config(build_parser().parse_args(["cluster"])) == ClusterConfig()
