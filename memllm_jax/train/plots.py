"""Loss curves (train and held-out) of one or more runs as a PNG, from their metrics.jsonl files."""

from __future__ import annotations

import math
import os
from typing import Sequence

from memllm_jax.files import atomic_open
from memllm_jax.train.metrics import read_metrics


def plot_loss(metrics_paths: Sequence[str], out_png: str, labels: Sequence[str] | None = None,
              title: str = "training loss") -> str:
    """One panel per run: train loss per logged step and eval loss (markers); written atomically."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = list(labels or [os.path.basename(os.path.dirname(os.path.abspath(p))) for p in metrics_paths])
    n = len(metrics_paths)
    fig, axes = plt.subplots(1, n, figsize=(5 * n, 3.6), squeeze=False)
    for ax, path, label in zip(axes[0], metrics_paths, labels):
        records = read_metrics(path)
        for kind, style in (("train", "-"), ("eval", "o-")):
            pts = [(r["step"], r["loss"]) for r in records
                   if r.get("kind") == kind and isinstance(r.get("loss"), float) and math.isfinite(r["loss"])]
            if pts:
                xs, ys = zip(*pts)
                ax.plot(xs, ys, style, label=f"{kind} loss", markersize=4)
        ax.set_title(label)
        ax.set_xlabel("step")
        ax.set_ylabel("cross-entropy (nats / loss token)")
        ax.grid(alpha=0.3)
        ax.legend()
    fig.suptitle(title)
    fig.tight_layout()
    with atomic_open(out_png, "wb") as f:
        fig.savefig(f, format="png", dpi=110)
    plt.close(fig)
    return out_png
