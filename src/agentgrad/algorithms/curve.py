"""A run's learning curve as a picture: ``reward_curve.png`` beside its ``metrics.jsonl``.

The demo and ``agentgrad train`` both draw it, so a user sees at a glance whether greedy success
on held-out tasks rose and stayed up. matplotlib is imported when a curve is drawn (it comes with
the ``train`` extra), never at import.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path


def plot_rewards(
    history: Sequence[Mapping[str, float]],
    validation: Sequence[tuple[int, float]],
    path: str | Path,
    *,
    title: str,
) -> Path:
    """The sampled training reward per step (``history`` rows' ``reward/mean``) and the greedy
    validation score at each validated step, on a 0–1 axis, as a PNG at ``path``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    rewarded = [h for h in history if "reward/mean" in h]
    if rewarded:
        ax.plot([h["step"] for h in rewarded], [h["reward/mean"] for h in rewarded], label="train reward (sampled)")
    if validation:
        ax.plot([s for s, _ in validation], [v for _, v in validation], "o-", label="greedy success (held-out)")
    ax.set_xlabel("GRPO step")
    ax.set_ylabel("reward / success")
    ax.set_ylim(0, 1)
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right")
    ax.set_title(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return Path(path)
