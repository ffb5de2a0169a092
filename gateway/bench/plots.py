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
    fig, ax = plt.subplots(figsize=(7, 4))
    for label, (xs, ys) in lines.items():
        ax.plot(list(xs), list(ys), marker=marker, label=label)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    if log_y:
        ax.set_yscale("log")
    if xticks is not None:
        ax.set_xticks(list(xticks))
    ax.set_title(title)
    ax.legend()
    ax.grid(True, alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True
