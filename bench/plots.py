"""PNG line plots for benchmark reports (matplotlib is optional: the `bench` extra)."""

from __future__ import annotations

from collections.abc import Sequence


def line_plot(
    lines: dict[str, tuple[Sequence[float], Sequence[float]]],
    path: str,
    *,
    xlabel: str,
    ylabel: str,
    title: str,
    log_y: bool = False,
    marker: str | None = None,
    xticks: Sequence[float] | None = None,
) -> bool:
    """One line per label (label -> (xs, ys)) saved to `path`. False when matplotlib is
    missing, so benchmarks still run and report numbers without it."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    fig, ax = plt.subplots(figsize=(8, 4.5) if len(lines) > 4 else (7, 4))
    for label, (xs, ys) in lines.items():
        dashed = "raw" in label  # ceilings and references: dashed, so the measured lines lead
        ax.plot(list(xs), list(ys), marker=marker, label=label, linestyle="--" if dashed else "-")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    if log_y:
        ax.set_yscale("log")
    if xticks is not None:
        ax.set_xticks(list(xticks))
    ax.set_title(title)
    if len(lines) > 4:  # many lines: the legend beside the plot, not over it
        ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5))
    else:
        ax.legend(fontsize=8)
    ax.grid(True, alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


def bar_plot(
    groups: dict[str, dict[str, float]],
    path: str,
    *,
    ylabel: str,
    title: str,
    log_y: bool = False,
) -> bool:
    """Grouped bars: one group per key of `groups` (e.g. a backend), one bar per inner key
    (e.g. "cold", "warm"), the same inner keys in every group. False without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    names = list(groups)
    series = list(dict.fromkeys(k for bars in groups.values() for k in bars))
    width = 0.8 / max(1, len(series))
    fig, ax = plt.subplots(figsize=(7, 4))
    for j, label in enumerate(series):
        xs = [i + (j - (len(series) - 1) / 2) * width for i in range(len(names))]
        ys = [groups[name].get(label, float("nan")) for name in names]
        bars = ax.bar(xs, ys, width, label=label)
        ax.bar_label(bars, fmt="%.0f", fontsize=7)
    ax.set_xticks(list(range(len(names))))
    ax.set_xticklabels(names)
    ax.set_ylabel(ylabel)
    if log_y:
        ax.set_yscale("log")
    ax.set_title(title)
    ax.legend(fontsize=8)
    ax.grid(True, axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True
