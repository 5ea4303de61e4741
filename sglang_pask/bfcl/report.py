"""Scores, tables, paired differences and the accuracy-vs-budget plot of a BFCL run.

Accuracy is BFCL's: the percentage of items whose answer the AST checker accepts, per category; the
average is the unweighted mean over the categories evaluated (as BFCL's and the PASK paper's AST
summaries are), so small categories weigh as much as large ones.

Two configurations answered over the same items differ by more than their noise only if the
difference of their averages holds up when the items are drawn again: :func:`paired_differences`
gives that difference with a stratified, paired bootstrap interval (each category's items redrawn
with replacement, the same draw for both configurations).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import numpy as np

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


@dataclass(frozen=True)
class Difference:
    """How far one configuration's average lies from a reference's over the same items.

    Attributes
    ----------
    label, reference : str
        The configuration and the reference (:attr:`ConfigResult.label`).
    points : float
        ``label``'s average minus ``reference``'s, in percentage points.
    low, high : float
        The bootstrap interval of ``points`` at the level asked for.
    """

    label: str
    reference: str
    points: float
    low: float
    high: float

    def cell(self) -> str:
        """``+13.6 [+4.9, +22.1]``."""
        return f"{self.points:+.1f} [{self.low:+.1f}, {self.high:+.1f}]"


def _verdicts_by_category(configs: Sequence[ConfigResult]) -> dict[str, np.ndarray]:
    """``{category: (n_category, len(configs))}`` 0/1 verdicts, rows in item-id order.

    Raises
    ------
    ValueError
        If the configurations did not answer the same items.
    """
    ids = sorted(r.id for r in configs[0].items)
    for config in configs[1:]:
        if sorted(r.id for r in config.items) != ids:
            raise ValueError(
                f"{config.label} and {configs[0].label} did not answer the same items, "
                "so their answers cannot be paired"
            )
    verdicts = [{r.id: r.valid for r in config.items} for config in configs]
    category = {r.id: r.category for r in configs[0].items}
    out = {}
    for name in AST_CATEGORIES:
        rows = [i for i in ids if category[i] == name]
        if rows:
            out[name] = np.array([[v[i] for v in verdicts] for i in rows], dtype=np.float64)
    return out


def paired_differences(
    configs: Sequence[ConfigResult],
    reference: ConfigResult,
    resamples: int = 10000,
    level: float = 0.95,
    seed: int = 0,
) -> list[Difference]:
    """Each configuration's average minus the reference's, with a paired bootstrap interval.

    Every resample redraws each category's items with replacement (as many as it has) and scores
    every configuration on the same draw, so what two configurations have in common (an item both
    answer, one neither does) does not widen the interval. The interval is the percentile interval
    of the resampled differences; the seed fixes it, so a report is reproducible.

    Parameters
    ----------
    configs : sequence of ConfigResult
        The configurations to compare (the reference among them or not).
    reference : ConfigResult
        What each is compared with.
    resamples : int
        Bootstrap resamples.
    level : float
        Coverage of the interval, in (0, 1).
    seed : int
        Seed of the resampling.

    Returns
    -------
    list of Difference
        One per configuration of ``configs``, in order.

    Raises
    ------
    ValueError
        If the configurations did not answer the same items, ``resamples < 1`` or ``level`` is
        outside (0, 1).
    """
    if resamples < 1 or not 0.0 < level < 1.0:
        raise ValueError(f"need resamples >= 1 and level in (0, 1), got {resamples} and {level}")
    everyone = [reference, *configs]
    by_category = _verdicts_by_category(everyone)
    rng = np.random.default_rng(seed)
    # (resamples, 1 + len(configs)) averages: the mean over categories of each draw's accuracy.
    averages = np.zeros((resamples, len(everyone)))
    for verdicts in by_category.values():
        n = verdicts.shape[0]
        counts = rng.multinomial(n, np.full(n, 1.0 / n), size=resamples)  # (resamples, n) draws per item
        averages += counts @ verdicts / n
    averages *= 100.0 / len(by_category)
    point = 100.0 * np.mean([v.mean(axis=0) for v in by_category.values()], axis=0)
    tail = 100.0 * (1.0 - level) / 2.0
    out = []
    for column, config in enumerate(configs, start=1):
        low, high = np.percentile(averages[:, column] - averages[:, 0], [tail, 100.0 - tail])
        out.append(Difference(config.label, reference.label, float(point[column] - point[0]), float(low), float(high)))
    return out


def format_differences(configs: Sequence[ConfigResult], references: Sequence[ConfigResult], level: float = 0.95) -> str:
    """Markdown table: one row per configuration, one column of :func:`paired_differences` per reference.

    Parameters
    ----------
    configs : sequence of ConfigResult
        The rows.
    references : sequence of ConfigResult
        The columns (a configuration is not compared with itself: ``-``).
    level : float
        Coverage of the intervals.

    Returns
    -------
    str
        The table; each cell is ``difference [low, high]`` in percentage points.
    """
    columns = [{d.label: d for d in paired_differences(configs, ref, level=level)} for ref in references]
    lines = [
        "| config | " + " | ".join(f"minus {ref.label}" for ref in references) + " |",
        "|---|" + "---:|" * len(references),
    ]
    for config in configs:
        cells = ["-" if config is ref else column[config.label].cell() for ref, column in zip(references, columns)]
        lines.append(f"| {config.label} | " + " | ".join(cells) + " |")
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
