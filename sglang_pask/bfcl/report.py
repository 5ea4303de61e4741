"""Scores, tables and the accuracy-vs-budget plot of a BFCL run.

Accuracy is BFCL's: the percentage of items whose answer the AST checker accepts, per category; the
average is the unweighted mean over the categories evaluated (as BFCL's and the PASK paper's AST
summaries are), so small categories weigh as much as large ones.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

from sglang_pask.bfcl.data import AST_CATEGORIES


@dataclass(frozen=True)
class ItemResult:
    """One answered item.

    Attributes
    ----------
    id, category : str
        The item.
    output : str
        The model's raw answer text.
    valid : bool
        BFCL's verdict.
    error_type : str
        BFCL's error class when invalid, else ``""``.
    latency_s : float
        Request latency (seconds) as the client saw it.
    prompt_tokens, completion_tokens : int
        Token counts reported by the server.
    finish_reason : str
        The server's finish reason (``"stop"`` or ``"length"``).
    """

    id: str
    category: str
    output: str
    valid: bool
    error_type: str
    latency_s: float
    prompt_tokens: int
    completion_tokens: int
    finish_reason: str


@dataclass(frozen=True)
class CategoryScore:
    """Accuracy of one category.

    Attributes
    ----------
    n : int
        Items evaluated.
    correct : int
        Items BFCL accepts.
    """

    n: int
    correct: int

    @property
    def accuracy(self) -> float:
        """Percentage correct (0-100)."""
        return 100.0 * self.correct / self.n


@dataclass
class ConfigResult:
    """The results of one (policy, budget) configuration.

    Attributes
    ----------
    policy : str
        KV policy name (``full``, ``pask``, ...).
    budget : float
        Total KV budget as a fraction of full KV (1.0 for ``full``).
    items : list of ItemResult
        Per-item results.
    wall_s : float
        Wall time of all requests (seconds).
    server : dict
        How the server was reached (URL, command, log file).
    """

    policy: str
    budget: float
    items: list[ItemResult] = field(default_factory=list)
    wall_s: float = 0.0
    server: dict = field(default_factory=dict)

    @property
    def label(self) -> str:
        """Column label, e.g. ``pask@0.33``."""
        return f"{self.policy}@{self.budget:g}"

    def scores(self) -> dict[str, CategoryScore]:
        """Per-category scores, in :data:`AST_CATEGORIES` order.

        Returns
        -------
        dict of str to CategoryScore
            Only categories with at least one item.
        """
        out = {}
        for category in AST_CATEGORIES:
            rows = [r for r in self.items if r.category == category]
            if rows:
                out[category] = CategoryScore(n=len(rows), correct=sum(r.valid for r in rows))
        return out

    def average(self) -> float:
        """Unweighted mean of the category accuracies (percent).

        Returns
        -------
        float
            The average.

        Raises
        ------
        ValueError
            If there are no results.
        """
        scores = self.scores()
        if not scores:
            raise ValueError(f"{self.label}: no results to average")
        return sum(s.accuracy for s in scores.values()) / len(scores)


def configs_from_record(record: dict) -> list[ConfigResult]:
    """Rebuild the configurations of a JSON record written by ``python -m bench.bfcl --json``.

    Parameters
    ----------
    record : dict
        The parsed JSON.

    Returns
    -------
    list of ConfigResult
        One per configuration, with every item result.
    """
    return [
        ConfigResult(
            policy=c["policy"],
            budget=float(c["budget"]),
            items=[ItemResult(**r) for r in c["items"]],
            wall_s=float(c["wall_s"]),
            server=dict(c["server"]),
        )
        for c in record["configs"]
    ]


def format_table(configs: Sequence[ConfigResult]) -> str:
    """Markdown table: one row per category plus the average, one column per configuration.

    Parameters
    ----------
    configs : sequence of ConfigResult
        The configurations, in column order.

    Returns
    -------
    str
        The table; each cell is ``accuracy (correct/n)``.
    """
    all_scores = [c.scores() for c in configs]
    categories = [cat for cat in AST_CATEGORIES if any(cat in s for s in all_scores)]
    lines = [
        "| category | " + " | ".join(c.label for c in configs) + " |",
        "|---|" + "---:|" * len(configs),
    ]
    for category in categories:
        cells = []
        for scores in all_scores:
            s = scores.get(category)
            cells.append(f"{s.accuracy:.1f} ({s.correct}/{s.n})" if s else "-")
        lines.append(f"| {category} | " + " | ".join(cells) + " |")
    lines.append("| **average** | " + " | ".join(f"**{c.average():.1f}**" for c in configs) + " |")
    return "\n".join(lines)


def plot_accuracy_vs_budget(configs: Sequence[ConfigResult], path: str | Path) -> None:
    """Save a PNG of average accuracy against KV budget, one line per policy.

    The budget axis spans 0 to 1. A policy measured at a single budget (``full`` at 1.0) is drawn
    as a marker plus a dashed horizontal reference line across the whole axis.

    Parameters
    ----------
    configs : sequence of ConfigResult
        The configurations.
    path : str or pathlib.Path
        Output PNG file.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    by_policy: dict[str, list[tuple[float, float]]] = {}
    for config in configs:
        by_policy.setdefault(config.policy, []).append((config.budget, config.average()))
    fig, ax = plt.subplots(figsize=(6, 4), dpi=120)
    for policy, points in sorted(by_policy.items()):
        points.sort()
        xs, ys = zip(*points)
        (line,) = ax.plot(xs, ys, marker="o", label=policy)
        if len(points) == 1:
            ax.hlines(ys[0], 0.0, 1.0, colors=line.get_color(), linestyles="dashed", linewidth=1)
    ax.set_xlabel("total KV budget (fraction of full KV)")
    ax.set_ylabel("BFCL AST accuracy, category mean (%)")
    ax.set_ylim(0, 100)
    ax.set_xlim(0.0, 1.05)
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
