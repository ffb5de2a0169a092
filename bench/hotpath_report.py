"""Rows, ratios, targets and the table of the hotpath bench (pure: no MLX, no HTTP).

Every figure is a `Row`: what was measured, its unit, the gateway's value and, where the raw
MLX ceiling measured the same work, the raw value; the ratio is gateway / raw (for ms, 1.05
means 5% slower than raw; for tok/s, 0.95 means 95% of raw's speed). Figures with no raw
counterpart (first request vs later ones, batching gain) are themselves ratios with a target.
"""

from __future__ import annotations

import math
import operator
from dataclasses import asdict, dataclass
from typing import Any

_OPS = {"<=": operator.le, ">=": operator.ge, "<": operator.lt, ">": operator.gt}


def _number(value: float | None) -> bool:
    return value is not None and math.isfinite(value)


def ratio(value: float | None, reference: float | None) -> float | None:
    """value / reference, or None unless both are finite and the reference is positive."""
    if not (_number(value) and _number(reference)) or reference <= 0:  # type: ignore[operator]
        return None
    return value / reference  # type: ignore[operator]


def meets(value: float | None, target: str) -> bool | None:
    """Whether `value` meets `target` ("<= 1.2", ">= 4", ...); None with no value or target."""
    if not target or not _number(value):
        return None
    op, _, bound = target.strip().partition(" ")
    if op not in _OPS:
        raise ValueError(f"target {target!r} must look like '<= 1.2'")
    return bool(_OPS[op](value, float(bound)))


@dataclass(frozen=True)
class Row:
    """One figure. `gateway` None means it could not be measured (`note` says why)."""

    key: str  # stable JSON name
    what: str  # human description
    unit: str  # "ms", "tok/s", "x" (a ratio), "s"
    gateway: float | None
    raw: float | None = None
    target: str = ""  # only where no raw applies, e.g. "<= 1.2"
    note: str = ""  # how it was measured, or the error that stopped it

    @property
    def ratio(self) -> float | None:
        return ratio(self.gateway, self.raw)

    @property
    def met(self) -> bool | None:
        return meets(self.gateway, self.target)

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "ratio": self.ratio, "met": self.met}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Row:
        """Inverse of `as_dict` (the derived fields are recomputed)."""
        return cls(**{k: v for k, v in data.items() if k not in ("ratio", "met")})


def failed(key: str, what: str, unit: str, error: BaseException | str, **kw: Any) -> Row:
    """A row whose scenario raised: no value, the error in the note."""
    if isinstance(error, str):
        note = error if error.startswith("SKIPPED") else f"ERROR {error}"
    else:
        note = f"ERROR {type(error).__name__}: {error}"
    return Row(key, what, unit, None, note=note[:300], **kw)


def _fmt(value: float | None, unit: str = "") -> str:
    if not _number(value):
        return "-"
    assert value is not None
    if unit == "x":
        return f"{value:.2f}x"
    return f"{value:.1f}" if abs(value) >= 10 else f"{value:.2f}"


def table(rows: list[Row]) -> str:
    """A markdown table: what | unit | raw | gateway | ratio | target | note."""
    lines = [
        "| what | unit | raw | gateway | gateway/raw | target | note |",
        "|---|---|---:|---:|---:|---|---|",
    ]
    for r in rows:
        met = {True: " ok", False: " MISSED", None: ""}[r.met]
        lines.append(
            f"| {r.what} | {r.unit} | {_fmt(r.raw)} | {_fmt(r.gateway, r.unit)} | "
            f"{_fmt(r.ratio, 'x')} | {r.target}{met} | {r.note} |"
        )
    return "\n".join(lines)


def brief(row: Row) -> str:
    """One progress line: `what: gateway unit (raw R, ratio) [target ok]`."""
    parts = [f"{row.what}: {_fmt(row.gateway, row.unit)} {'' if row.unit == 'x' else row.unit}"]
    if row.raw is not None:
        parts.append(f"(raw {_fmt(row.raw)}, {_fmt(row.ratio, 'x')})")
    if row.target:
        parts.append(f"[target {row.target}: {'-' if row.met is None else row.met}]")
    if row.note.startswith(("ERROR", "SKIPPED")):
        parts.append(row.note)
    return " ".join(p.strip() for p in parts)


def report(rows: list[Row], **meta: Any) -> dict[str, Any]:
    """The JSON payload: `meta` (machine, model, args, raw, ...), rows with ratios, table."""
    return {**meta, "rows": [r.as_dict() for r in rows], "table": table(rows)}


def plot(rows: list[Row], path: str) -> bool:
    """A horizontal bar chart of gateway/raw (and target ratios) per row; False without
    matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    shown = []
    for r in rows:  # raw ratios, and the rows that are themselves ratios
        value = r.ratio if r.ratio is not None else (r.gateway if r.unit == "x" else None)
        if _number(value) and value > 0:  # type: ignore[operator]
            shown.append((r.what, value))
    if not shown:
        return False
    fig, ax = plt.subplots(figsize=(9, 0.4 * len(shown) + 1.5))
    values = [v for _, v in shown][::-1]
    # Bars grow from parity (1x) on a log axis, so 0.5x and 2x look equally far off.
    ax.barh([w for w, _ in shown][::-1], [v - 1 for v in values], left=1.0, color="tab:blue")
    ax.axvline(1.0, color="black", linewidth=0.8)
    ax.set_xscale("log")
    ax.set_xlabel("gateway / raw MLX (ms rows: lower is better; tok/s rows: higher)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True
