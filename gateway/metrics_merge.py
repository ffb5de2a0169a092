"""Several processes' Prometheus metrics as one exposition: the engine replicas of a cluster
(`replica` label) or the engine processes of several models (`model` label). Each family
appears once: its samples summed over the parts under their own names and labels (what one
server would report), then each part's samples again with the part's label (so PromQL
`{model=""}` selects the totals and `{model="qwen"}` one model's series).

Pure functions over text; no Ray, no MLX.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.utils import floatToGoString

# Gauges that are settings or ratios: the total is the largest part's, not a sum.
_NON_ADDITIVE_GAUGES = ("_ratio", "_block_tokens", "_bytes_per_token", "_kv_cache_bits")


def merge_metrics(parts: Sequence[tuple[object, bytes | str]], label: str = "replica") -> bytes:
    """One Prometheus text exposition from the parts' `(id, metrics_text)`: each family once,
    its samples summed over the parts, then each part's with a `label="id"` label."""
    families: dict[str, dict[str, Any]] = {}
    for part, text in parts:
        if isinstance(text, bytes):
            text = text.decode("utf-8")
        for family in text_string_to_metric_families(text):
            entry = families.setdefault(
                family.name,
                {"type": family.type, "doc": family.documentation, "total": {}, "each": []},
            )
            for sample in family.samples:
                labels = tuple(sample.labels.items())  # (the exporter's order)
                entry["each"].append((sample.name, (*labels, (label, str(part))), sample.value))
                if sample.name.endswith("_created"):
                    continue  # a timestamp per process: no total
                key = (sample.name, labels)
                before = entry["total"].get(key)
                if before is None:
                    entry["total"][key] = sample.value
                elif family.type == "gauge" and family.name.endswith(_NON_ADDITIVE_GAUGES):
                    entry["total"][key] = max(before, sample.value)
                else:
                    entry["total"][key] = before + sample.value
    lines: list[str] = []
    for name, entry in families.items():
        # prometheus_client writes (and its parser expects) a counter's header with _total.
        header = f"{name}_total" if entry["type"] == "counter" else name
        lines.append(f"# HELP {header} {_escape_doc(entry['doc'])}")
        lines.append(f"# TYPE {header} {entry['type']}")
        lines.extend(_line(s, labels, v) for (s, labels), v in entry["total"].items())
        lines.extend(_line(s, labels, v) for s, labels, v in entry["each"])
    return ("\n".join(lines) + "\n").encode() if lines else b""


def _line(name: str, labels: Sequence[tuple[str, str]], value: float) -> str:
    if not labels:
        return f"{name} {floatToGoString(value)}"
    inner = ",".join(f'{k}="{_escape_label(v)}"' for k, v in labels)
    return f"{name}{{{inner}}} {floatToGoString(value)}"


def _escape_label(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _escape_doc(doc: str) -> str:
    return doc.replace("\\", "\\\\").replace("\n", "\\n")
