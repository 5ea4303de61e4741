"""BFCL accuracy against the KV bytes a request measurably holds, one line per method:
``python -m bench.frontier``.

For each method (a row of :data:`METHODS`: full KV, SGLang's fp8 KV, the token droppers, droppers that
keep what they drop at low bits, PASK dropping and PASK's three tiers) at each byte point (a share of
full KV's bytes per request: the launcher's ``--kv-bytes``), this starts
``python -m sglang_pask.launch_server`` with that method's flags (and ``--kv-layer-groups 4
--disable-radix-cache``, and ``--server-args``), and sends every BFCL item once to ``/generate``: the
chat template applied here, greedy, at most ``--max-tokens`` answer tokens, the answer constrained by
``--grammar``. Accuracy and bytes come from the same answers:

* accuracy: BFCL's AST checker on the answer text; the unweighted mean of the category accuracies, in %;
* bytes: what the request's layer groups held at its last step (its ``meta_info["kv_stats"]``) at each
  group's ``bytes_per_slot`` (``/server_info``), as a share of full KV of the same length::

      share = sum_g (kept_tokens[g] + lowbit_slots[g]) * bytes_per_slot[g]
              / (full_tokens * sum_g bytes_per_slot[g])

  (``lowbit_slots`` absent: zeros; the same bytes as ``bench.memory``), averaged over the items. The
  window, the sinks and the generated tokens are in it, so a method sits where it is, not at its
  nominal point.

A request that fails (an HTTP error, or no answer within ``--request-timeout``) counts as incorrect,
with its error type, and the run goes on. A configuration the launcher refuses (exit status 2 with its
one-line error: SGLang's fp8 KV, which the layer-group pool does not serve; ``k4v2`` at 0.15, below
what the format alone costs) is recorded as refused with that message, so the page says why a method
has no point there; any other start-up failure ends the run.

The report has one row per (point, method): accuracy, bytes (mean, min-max over the items), the
difference to ``full`` in points with a 95% paired bootstrap interval that redraws each category's
items, and the difference to the most accurate other method measured at the same point, with its
interval and the exact McNemar p of the pair (and a note where their measured bytes lie more than
0.03 apart). Two configurations are compared on the items both answered. ``--plot`` draws accuracy
against measured bytes, one line per method.

PASK's policy files: ``--tier-policy P=FILE`` gives pask-tiers its ``--pask-policy`` at point P (without
one the launcher picks the file it ships for P, or refuses), ``--drop-policy P=FILE`` pask-drop's
(without one: the shipped keep policy).

On the 2-core CPU one configuration of the 228 evaluation items takes about 30-40 minutes, so the
whole grid (62 configurations) takes well over a day: run it in pieces, each with ``--json`` (written
after every configuration; ``--resume`` skips the configurations the file holds), and merge the
pieces with ``--from-json``.

Examples
--------
Two methods at two points, then the pieces of other sessions merged into one page::

    python -m bench.frontier --methods full snapkv pask-drop --points 0.25 0.33 \\
        --server-args "--dtype bfloat16" --json part1.json --resume
    python -m bench.frontier --from-json part1.json part2.json --markdown frontier.md --plot frontier.png

A server started by hand, measured as one configuration::

    python -m bench.frontier --url http://127.0.0.1:30000 --label snapkv@0.25 --limit 2 --json one.json
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from concurrent.futures import as_completed
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, NoReturn, Optional

import requests
from tqdm import tqdm

from bench.bfcl import DEFAULT_GRAMMAR, TIMEOUT_ERROR, disagreements, parse_budgets, parse_config_label, select_items
from bench.common import (
    REPO_ROOT,
    exact_mcnemar_p,
    exit_on_sigterm,
    kv_share,
    positive_int,
    read_json_files,
    refuse_flags_given,
    run_exit_status,
    run_header,
)
from sglang_pask.bfcl.checker import check
from sglang_pask.bfcl.constraints import CONSTRAINTS, answer_constraint
from sglang_pask.bfcl.data import AST_CATEGORIES, BfclItem
from sglang_pask.bfcl.report import ConfigResult, Difference, ItemResult, paired_differences
from sglang_pask.cli_paths import output_file
from sglang_pask.launch_server import PROG as LAUNCHER_PROG
from sglang_pask.request_pool import request_pool
from sglang_pask.server_process import ServerProcess, ServerStartError

PROG = "python -m bench.frontier"
#: The items when ``--ids`` is not given (the evaluation split's 228 ids), if the file is there.
DEFAULT_IDS = REPO_ROOT / "bench" / "results" / "frontier_2026-12-07" / "eval228_ids.txt"
DEFAULT_POINTS = ("0.10", "0.15", "0.20", "0.25", "0.33", "0.50")
#: Launcher flags of every configuration, before the method's own and ``--server-args``.
COMMON_FLAGS: tuple[str, ...] = ("--kv-layer-groups", "4", "--disable-radix-cache")
#: Flags the methods set, refused inside ``--server-args``.
METHOD_FLAGS = ("--kv-policy", "--kv-bytes", "--kv-budget", "--kv-dropped", "--kv-decode", "--pask-policy")
#: The launcher's exit status when it refuses its flags (with one line ``PROG: error: ...``).
LAUNCHER_REFUSAL_STATUS = 2
MEASURED = "measured"
REFUSED = "refused"
FULL = "full"
#: Coverage of the intervals of the differences.
LEVEL = 0.95
#: Two configurations at one point whose measured mean bytes differ by more than this get a note.
BYTES_GAP = 0.03

#: Launcher flags of a method at a byte point, given its PASK policy file for that point (None: none given).
FlagsAt = Callable[[float, Optional[str]], list[str]]


@dataclass(frozen=True)
class Method:
    """One line of the frontier: how a server is started for a byte point.

    Attributes
    ----------
    name : str
        The method's name (``METHOD@POINT`` labels its configurations).
    doc : str
        What it is, one line.
    flags : FlagsAt
        Its launcher flags at a point.
    point : float or None
        The only point it runs at, whatever ``--points`` says (full KV at 1, fp8 at 0.5); None: every point.
    policy_option : str or None
        The bench's flag (``--tier-policy``, ``--drop-policy``) whose ``P=FILE`` pairs give its
        ``--pask-policy`` at each point P; None: it reads no policy file.
    """

    name: str
    doc: str
    flags: FlagsAt
    point: Optional[float] = None
    policy_option: Optional[str] = None


def _dropper(policy: str) -> FlagsAt:
    """A policy that evicts the prompt tokens it does not keep: the budget is the byte share."""
    return lambda point, policy_file: ["--kv-policy", policy, "--kv-decode", "keep", "--kv-bytes", f"{point:g}"]


def _lowbit(policy: str, dropped: str) -> FlagsAt:
    """A policy whose dropped tokens stay readable in the ``dropped`` low-bit format."""
    return lambda point, policy_file: [
        *("--kv-policy", policy, "--kv-dropped", dropped, "--kv-decode", "lowbit", "--kv-bytes", f"{point:g}")
    ]


def _with_policy_file(flags: FlagsAt) -> FlagsAt:
    """``flags`` and, where a policy file is given for the point, ``--pask-policy FILE``."""
    return lambda point, policy_file: (
        flags(point, None) + ([] if policy_file is None else ["--pask-policy", policy_file])
    )


METHODS: dict[str, Method] = {
    m.name: m
    for m in (
        Method("full", "full KV: every token at the model's precision (the reference)", lambda p, t: [], point=1.0),
        Method(
            "sglang-fp8",
            "SGLang's own fp8 KV cache (--kv-cache-dtype fp8_e4m3): half of bf16's bytes",
            lambda p, t: ["--kv-policy", "full", "--kv-cache-dtype", "fp8_e4m3"],
            point=0.5,
        ),
        Method(
            "streaming-llm-k4v2",
            "StreamingLLM's sinks and window in full, every other token at 4-bit keys and 2-bit values",
            _lowbit("streaming-llm", "k4v2"),
        ),
        Method(
            "streaming-llm-2bit",
            "StreamingLLM's sinks and window in full, every other token at 2-bit keys and values",
            _lowbit("streaming-llm", "2bit"),
        ),
        Method(
            "snapkv-k4v2",
            "SnapKV's top-scored tokens in full, every other token at 4-bit keys and 2-bit values",
            _lowbit("snapkv", "k4v2"),
        ),
        Method(
            "snapkv-2bit",
            "SnapKV's top-scored tokens in full, every other token at 2-bit keys and values",
            _lowbit("snapkv", "2bit"),
        ),
        Method(
            "streaming-llm",
            "StreamingLLM: the sinks and the recent window, the rest evicted",
            _dropper("streaming-llm"),
        ),
        Method(
            "snapkv", "SnapKV: the prompt tokens the last queries attend to most, the rest evicted", _dropper("snapkv")
        ),
        Method(
            "pyramidkv",
            "PyramidKV: SnapKV's scores, budgets shrinking with depth, the rest evicted",
            _dropper("pyramidkv"),
        ),
        Method("h2o", "H2O: the heavy hitters of accumulated attention, the rest evicted", _dropper("h2o")),
        Method(
            "pask-drop",
            "PASK: tokens kept by structural role, the rest evicted (--drop-policy P=FILE; else the "
            "launcher's shipped keep policy)",
            _with_policy_file(_dropper("pask")),
            policy_option="--drop-policy",
        ),
        Method(
            "pask-tiers",
            "PASK's three tiers: per (layer group, role) full, k4v2 or evicted, by a policy solved for the "
            "point (--tier-policy P=FILE; else the launcher's shipped file for P, or its refusal)",
            _with_policy_file(_lowbit("pask", "k4v2")),
            policy_option="--tier-policy",
        ),
    )
}


class FrontierError(RuntimeError):
    """A configuration could not be measured (a server that failed to start or stopped answering, a
    response without ``kv_stats``); the message names the configuration."""


class _Parser(argparse.ArgumentParser):
    """argparse whose usage errors are one line on stderr (``PROG: error: ...``) and exit status 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message}\n")


class _Formatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    pass


def label_of(method: str, point: float) -> str:
    """``snapkv@0.25``."""
    return f"{method}@{point:g}"


def _key(method: str, point: float) -> tuple[str, float]:
    return method, round(float(point), 6)


def configurations(methods: Sequence[str], points: Sequence[float]) -> list[tuple[str, float]]:
    """The (method, point) grid in run order: each method at its own point if it has one (``full``
    at 1, ``sglang-fp8`` at 0.5), else at every point."""
    grid: list[tuple[str, float]] = []
    for name in dict.fromkeys(methods):
        fixed = METHODS[name].point
        grid.extend([(name, fixed)] if fixed is not None else [(name, p) for p in points])
    return grid


def server_flags(method: str, point: float, server_args: str, policy_file: Optional[str] = None) -> list[str]:
    """Launcher flags of one configuration: :data:`COMMON_FLAGS`, the method's flags at ``point``
    (``policy_file``: its PASK policy file for that point, if given), then ``server_args`` (shell syntax)."""
    return [*COMMON_FLAGS, *METHODS[method].flags(point, policy_file), *shlex.split(server_args)]


def pool_bytes_per_slot(url: str, label: str) -> list[int]:
    """Each layer group's ``bytes_per_slot`` from the server's ``/server_info``.

    Raises
    ------
    FrontierError
        If the server reports no layer-group pool.
    """
    response = requests.get(f"{url}/server_info", timeout=60)
    response.raise_for_status()
    try:
        groups = response.json()["internal_states"][0]["sglang_pask"]["kv_pool"]["groups"]
        return [int(group["bytes_per_slot"]) for group in groups]
    except (KeyError, IndexError, TypeError) as exc:
        raise FrontierError(
            f"{label}: /server_info of {url} has no internal_states[0].sglang_pask.kv_pool.groups[*].bytes_per_slot "
            f"({type(exc).__name__}: {exc}); is it python -m sglang_pask.launch_server with a layer-group pool?"
        ) from None


@lru_cache(maxsize=4)
def _tokenizer(path: str) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path)


def server_tokenizer(url: str) -> Any:
    """The tokenizer of the model a server serves (``/model_info``: its tokenizer path, else its model path)."""
    response = requests.get(f"{url}/model_info", timeout=60)
    response.raise_for_status()
    info = response.json()
    return _tokenizer(info.get("tokenizer_path") or info["model_path"])


def _item_entry(item: BfclItem, **fields: Any) -> dict:
    return {"id": item.id, "category": item.category, **fields}


def _failed_item(item: BfclItem, error_type: str, latency_s: float) -> dict:
    """An item whose request failed: incorrect, ``error_type`` recorded, no bytes."""
    return _item_entry(
        item,
        output="",
        valid=False,
        error_type=error_type,
        bytes=None,
        prompt_tokens=0,
        completion_tokens=0,
        latency_s=latency_s,
        finish_reason="error",
    )


def answer(
    url: str, label: str, item: BfclItem, prompt: str, bytes_per_slot: Sequence[int], args: argparse.Namespace
) -> dict:
    """Ask one item through ``/generate`` and score it.

    Parameters
    ----------
    url, label : str
        The server and its configuration's label.
    item : BfclItem
        The item.
    prompt : str
        Its chat prompt (the template applied, generation prompt added).
    bytes_per_slot : sequence of int
        The pool's bytes per slot of each layer group.
    args : argparse.Namespace
        ``grammar``, ``max_tokens``, ``request_timeout``.

    Returns
    -------
    dict
        The item's record: ``id``, ``category``, ``output``, ``valid``, ``error_type``, ``bytes``
        (:func:`kv_share`), ``prompt_tokens``, ``completion_tokens``, ``latency_s``, ``finish_reason``.
        A timeout or an HTTP error gives an incorrect item with ``bytes`` None and error type
        ``request_timeout`` or ``http_<status>``.

    Raises
    ------
    FrontierError
        If the answer has no ``kv_stats``, or stats of another number of groups than the pool.
    requests.ConnectionError
        If the server does not answer at all.
    """
    sampling = {"temperature": 0, "max_new_tokens": args.max_tokens, **answer_constraint(item, args.grammar)}
    start = time.perf_counter()
    try:
        response = requests.post(
            f"{url}/generate", json={"text": prompt, "sampling_params": sampling}, timeout=args.request_timeout
        )
    except requests.Timeout:
        print(f"{label} {item.id}: no answer within --request-timeout {args.request_timeout:g} s", file=sys.stderr)
        return _failed_item(item, TIMEOUT_ERROR, time.perf_counter() - start)
    latency = time.perf_counter() - start
    if response.status_code != 200:
        print(f"{label} {item.id}: HTTP {response.status_code}: {response.text[:200]}", file=sys.stderr)
        return _failed_item(item, f"http_{response.status_code}", latency)
    payload = response.json()
    meta = payload.get("meta_info") or {}
    stats = meta.get("kv_stats")
    if stats is None:
        raise FrontierError(
            f"{label}: the answer to {item.id} has no meta_info.kv_stats; is the server "
            "python -m sglang_pask.launch_server with a layer-group pool?"
        )
    try:
        share = kv_share(stats, bytes_per_slot)
    except (ValueError, KeyError) as exc:
        raise FrontierError(f"{label}: the kv_stats of {item.id} do not fit the pool: {exc}") from None
    text = payload.get("text") or ""
    verdict = check(item, text)
    finish = meta.get("finish_reason")
    return _item_entry(
        item,
        output=text,
        valid=verdict.valid,
        error_type=verdict.error_type,
        bytes=share,
        prompt_tokens=int(meta.get("prompt_tokens", 0)),
        completion_tokens=int(meta.get("completion_tokens", 0)),
        latency_s=latency,
        finish_reason=str(finish.get("type") if isinstance(finish, dict) else finish),
    )


def measure(url: str, method: str, point: float, items: Sequence[BfclItem], args: argparse.Namespace) -> dict:
    """Ask every item of one configuration (``--concurrency`` in flight) and score them.

    Returns
    -------
    dict
        The configuration's record (:func:`measured_entry`), items in the order of ``items``,
        ``flags`` None and ``server`` its URL (the caller fills in what it started).

    Raises
    ------
    FrontierError
        See :func:`answer`, :func:`pool_bytes_per_slot`.
    requests.RequestException
        If the server stops answering.
    """
    from bench.memory import chat_prompt

    label = label_of(method, point)
    bytes_per_slot = pool_bytes_per_slot(url, label)
    tokenizer = server_tokenizer(url)
    results: dict[str, dict] = {}
    start = time.perf_counter()
    with request_pool(args.concurrency) as pool:
        futures = [
            pool.submit(answer, url, label, item, chat_prompt(tokenizer, item), bytes_per_slot, args) for item in items
        ]
        with tqdm(total=len(futures), desc=label, unit="item", file=sys.stderr) as bar:
            for future in as_completed(futures):
                result = future.result()
                results[result["id"]] = result
                bar.update(1)
                bar.set_postfix(correct=sum(r["valid"] for r in results.values()))
    return measured_entry(
        method, point, None, [results[item.id] for item in items], time.perf_counter() - start, {"url": url}
    )


def measured_entry(
    method: str, point: float, flags: Optional[list[str]], items: list[dict], wall_s: float, server: dict
) -> dict:
    """A measured configuration as ``--json`` holds it: ``accuracy`` the category mean (%), ``bytes``
    the mean share over the items that have one (None if none has)."""
    shares = [item["bytes"] for item in items if item["bytes"] is not None]
    return {
        "method": method,
        "point": point,
        "flags": flags,
        "status": MEASURED,
        "message": "",
        "accuracy": config_result({"method": method, "point": point, "items": items}).average(),
        "bytes": sum(shares) / len(shares) if shares else None,
        "wall_s": wall_s,
        "server": server,
        "items": items,
    }


def refused_entry(method: str, point: float, flags: list[str], message: str, log: str) -> dict:
    """A configuration the launcher refused, with its message."""
    return {
        "method": method,
        "point": point,
        "flags": flags,
        "status": REFUSED,
        "message": message,
        "accuracy": None,
        "bytes": None,
        "wall_s": 0.0,
        "server": {"log": log},
        "items": [],
    }


def refusal_message(log: str) -> Optional[str]:
    """The launcher's own refusal in a server log: the text after ``python -m sglang_pask.launch_server:
    error: `` on its last such line; None if the log has none."""
    prefix = f"{LAUNCHER_PROG}: error: "
    lines = [line[len(prefix) :].strip() for line in log.splitlines() if line.startswith(prefix)]
    return lines[-1] if lines else None


def start_failure(label: str, server: Any, exc: Exception) -> str:
    """Why a configuration's server did not start, when the launcher refused it.

    Parameters
    ----------
    label : str
        The configuration.
    server : ServerProcess
        The server (``process.poll()`` its exit status, ``log_tail()`` its log).
    exc : Exception
        What :meth:`ServerProcess.wait_ready` raised.

    Returns
    -------
    str
        The launcher's message, when it exited with :data:`LAUNCHER_REFUSAL_STATUS` and a line of its own.

    Raises
    ------
    FrontierError
        Any other failure (another exit status, a timeout, SGLang's own parser refusing a flag).
    """
    if server.process.poll() == LAUNCHER_REFUSAL_STATUS:
        message = refusal_message(server.log_tail(50))
        if message is not None:
            return message
    raise FrontierError(f"the {label} server did not start: {exc}")


def run_configuration(
    method: str, point: float, items: Sequence[BfclItem], args: argparse.Namespace, log_dir: Path
) -> dict:
    """Start the server of one configuration, measure it and stop it; a refusal is recorded, not raised.

    Raises
    ------
    FrontierError
        If the server fails to start other than by a refusal, or stops answering.
    """
    label = label_of(method, point)
    flags = server_flags(method, point, args.server_args, args.policy_files.get(method, {}).get(round(point, 6)))
    log_path = log_dir / f"{label}.log"
    server = ServerProcess(flags, log_path)
    print(f"starting {label} on {server.url}, log {log_path}", file=sys.stderr)
    try:
        try:
            server.wait_ready(timeout_s=args.server_timeout)
        except ServerStartError as exc:
            message = start_failure(label, server, exc)
            print(f"{label}: refused by the launcher: {message}", file=sys.stderr)
            return refused_entry(method, point, flags, message, str(log_path))
        try:
            entry = measure(server.url, method, point, items, args)
        except requests.RequestException as exc:
            raise FrontierError(
                f"the {label} run failed ({type(exc).__name__}: {exc}); the server's log ended:\n{server.log_tail(10)}"
            ) from None
    finally:
        server.stop()
    command = shlex.join(["python", "-m", "sglang_pask.launch_server", *flags])
    return {**entry, "flags": flags, "server": {"command": command, "log": str(log_path)}}


# ---------------------------------------------------------------------------------------------- report


def config_result(entry: dict) -> ConfigResult:
    """A configuration record's items as a :class:`ConfigResult` (label ``METHOD@POINT``)."""
    items = [
        ItemResult(
            id=i["id"],
            category=i["category"],
            output=i.get("output", ""),
            valid=bool(i["valid"]),
            error_type=i.get("error_type", ""),
            latency_s=float(i.get("latency_s", 0.0)),
            prompt_tokens=int(i.get("prompt_tokens", 0)),
            completion_tokens=int(i.get("completion_tokens", 0)),
            finish_reason=str(i.get("finish_reason", "")),
        )
        for i in entry["items"]
    ]
    return ConfigResult(policy=entry["method"], budget=float(entry["point"]), items=items)


@dataclass(frozen=True)
class Comparison:
    """One configuration against another on the items both answered.

    Attributes
    ----------
    difference : Difference
        The first's average minus the other's, with its interval (:func:`paired_differences`).
    only_this, only_other : int
        Items only the first answered right, and items only the other did.
    common : int
        The items both answered.
    differ : bool
        Whether either answered items the other did not.
    """

    difference: Difference
    only_this: int
    only_other: int
    common: int
    differ: bool

    @property
    def p(self) -> float:
        """Exact two-sided McNemar p of :attr:`only_this` against :attr:`only_other`."""
        return exact_mcnemar_p(self.only_this, self.only_other)

    def cell(self) -> str:
        """``-25.0 [-50.0, +0.0]``, with ``(on N common items)`` when the item sets differ."""
        return self.difference.cell() + (f" (on {self.common} common items)" if self.differ else "")


def compare(this: ConfigResult, other: ConfigResult) -> Optional[Comparison]:
    """``this`` against ``other`` on the items both answered; None if they answered none in common."""
    mine, theirs = {r.id for r in this.items}, {r.id for r in other.items}
    common = mine & theirs
    if not common:
        return None
    a, b = (ConfigResult(c.policy, c.budget, [r for r in c.items if r.id in common]) for c in (this, other))
    (difference,) = paired_differences([a], b, level=LEVEL)
    only_this, only_other = disagreements(a, b)
    return Comparison(difference, only_this, only_other, len(common), mine != theirs)


@dataclass(frozen=True)
class Row:
    """One (point, method) line of the report.

    Attributes
    ----------
    entry : dict
        The configuration's record.
    versus_full : Comparison or None
        Against ``full`` (None: this is full, full was not measured or shares no item).
    best : dict or None
        The record of the most accurate other method measured at the same point.
    versus_best : Comparison or None
        Against that method.
    """

    entry: dict
    versus_full: Optional[Comparison]
    best: Optional[dict]
    versus_best: Optional[Comparison]

    @property
    def best_label(self) -> Optional[str]:
        """The best other method's label, ``h2o@0.25``."""
        return None if self.best is None else label_of(self.best["method"], self.best["point"])

    def bytes_gap(self) -> Optional[float]:
        """This one's mean bytes minus the best other's, where both have a mean."""
        if self.best is None or self.entry["bytes"] is None or self.best["bytes"] is None:
            return None
        return self.entry["bytes"] - self.best["bytes"]


def _order(entry: dict) -> tuple[float, int, str]:
    """Points from the highest (full KV first), then methods in :data:`METHODS` order."""
    names = list(METHODS)
    method = entry["method"]
    return -float(entry["point"]), names.index(method) if method in names else len(names), method


def report_rows(configs: Sequence[dict]) -> list[Row]:
    """The report's rows, in :func:`_order`; measured rows carry their comparisons."""
    configs = sorted(configs, key=_order)
    measured = [c for c in configs if c["status"] == MEASURED and c["items"]]
    results = {id(c): config_result(c) for c in measured}
    full = next((c for c in measured if c["method"] == FULL), None)
    rows = []
    for entry in configs:
        if entry["status"] != MEASURED or not entry["items"]:
            rows.append(Row(entry, None, None, None))
            continue
        mine = results[id(entry)]
        versus_full = None if full is None or full is entry else compare(mine, results[id(full)])
        others = [c for c in measured if c is not entry and round(c["point"] - entry["point"], 6) == 0]
        best = max(others, key=lambda c: c["accuracy"], default=None)  # the first of the most accurate
        versus_best = None if best is None else compare(mine, results[id(best)])
        rows.append(Row(entry, versus_full, best, versus_best))
    return rows


def _note(row: Row) -> str:
    """A refusal's message; else the PASK policy file given to the server, the requests that failed
    and a measured gap in bytes to the best other method above :data:`BYTES_GAP`."""
    entry = row.entry
    if entry["status"] == REFUSED:
        return f"refused: {entry['message']}"
    if not entry["items"]:
        return "no items"
    flags = entry.get("flags") or []
    notes = [f"--pask-policy {flags[i + 1]}" for i, flag in enumerate(flags[:-1]) if flag == "--pask-policy"]
    failed: dict[str, int] = {}
    for item in entry["items"]:
        if item["bytes"] is None:
            failed[item["error_type"]] = failed.get(item["error_type"], 0) + 1
    if failed:
        counts = ", ".join(f"{kind} x{n}" for kind, n in sorted(failed.items()))
        notes.append(f"{sum(failed.values())} of {len(entry['items'])} requests failed, counted incorrect ({counts})")
    gap = row.bytes_gap()
    if gap is not None and abs(gap) > BYTES_GAP:
        side = "above" if gap > 0 else "below"
        notes.append(f"measured bytes {abs(gap):.3f} {side} {row.best_label}'s")
    return "; ".join(notes)


def _bytes_cell(entry: dict) -> str:
    shares = [item["bytes"] for item in entry["items"] if item["bytes"] is not None]
    if not shares:
        return "-"
    return f"{sum(shares) / len(shares):.3f} ({min(shares):.3f}-{max(shares):.3f})"


def format_table(rows: Sequence[Row]) -> str:
    """Markdown table of :func:`report_rows`; a refused row shows the launcher's message."""
    lines = [
        "| point | method | items | accuracy % | KV bytes / full: mean (min-max) | minus full, points [95%] | "
        "best other at this point | minus it, points [95%] | only this : only it (McNemar p) | note |",
        "|---:|---|---:|---:|---:|---:|---|---:|---:|---|",
    ]
    for row in rows:
        entry = row.entry
        measured = entry["status"] == MEASURED and entry["items"]
        best = row.versus_best
        cells = [
            f"{entry['point']:g}",
            entry["method"],
            str(len(entry["items"])) if measured else "-",
            f"{entry['accuracy']:.1f}" if measured else "-",
            _bytes_cell(entry) if measured else "-",
            row.versus_full.cell() if row.versus_full else "-",
            row.best_label or "-",
            best.cell() if best else "-",
            f"{best.only_this} : {best.only_other} (p = {best.p:.2g})" if best else "-",
            _note(row).replace("|", "\\|").replace("\n", " "),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _run_line(record: dict, name: str) -> str:
    """One run of the page, from its file ``name``: its command, date, commit and machine, what chose
    its items, how they were asked, the runs it resumed and how it ended."""
    settings = record.get("settings") or {}
    machine = record["machine"]
    if settings.get("url"):
        how = f"a running server ({settings['url']})"
    else:
        how = f"server args `{settings.get('server_args', '')}`" if settings.get("server_args") else "no server args"
    chosen = settings.get("ids_file") or f"{settings.get('split')} split"
    limit = f", at most {settings['limit']} per category" if settings.get("limit") else ""
    line = (
        f"- `{record['command']}` ({name}): {record['date']}, commit {record['commit']}, "
        f"{machine['platform']} ({machine['processor']}), nproc {machine['nproc']}; "
        f"{settings.get('items', '?')} items ({chosen}{limit}), grammar {settings.get('grammar')}, "
        f"max tokens {settings.get('max_tokens')}, concurrency {settings.get('concurrency')}, {how}"
    )
    for earlier in record.get("resumed_from", []):
        line += f"; resumes `{earlier['command']}` ({earlier['date']}, commit {earlier['commit']})"
    if record.get("error"):
        line += f"; **incomplete**: {record['error'].splitlines()[0]}"
    return line


def report_markdown(records: Sequence[dict], names: Sequence[str], rows: Sequence[Row]) -> str:
    """The page: each run's header, what the columns mean, the table and the methods' flags."""
    lines = [
        "# BFCL accuracy against KV bytes per request",
        "",
        *(_run_line(record, name) for record, name in zip(records, names)),
        "",
        "Accuracy: BFCL's AST checker, the unweighted mean of the category accuracies (%). KV bytes: what a "
        "request's layer groups held at its last step, sum_g (kept_tokens[g] + lowbit_slots[g]) * "
        "bytes_per_slot[g] / (full_tokens * sum_g bytes_per_slot[g]), from the same answers (mean over the "
        "items, and the smallest and largest). Differences are in points with a "
        f"{LEVEL:.0%} interval by a paired bootstrap that redraws each category's items; the best other "
        "method is the most accurate other one measured at the same point, and only this : only it counts "
        "the items only one of the two answered right (exact two-sided McNemar p). Two configurations are "
        "compared on the items both answered (a cell says so when their items differ); where a method's "
        f"measured bytes lie more than {BYTES_GAP:g} from the best other's, the note says so. A refused "
        "configuration is one the launcher would not start, with its reason.",
        "",
        format_table(rows),
        "",
        "Methods, with their launcher flags (every configuration also has `" + " ".join(COMMON_FLAGS) + "` and "
        "the run's server args):",
        "",
        *(
            f"- `{m.name}`: {m.doc}. "
            + (
                f"Only at {m.point:g}: `{' '.join(m.flags(m.point, None)) or '(none of its own)'}`"
                if m.point is not None
                else f"At point P = 0.25: `{' '.join(m.flags(0.25, None))}`"
            )
            for m in METHODS.values()
        ),
    ]
    return "\n".join(lines) + "\n"


def plot_frontier(configs: Sequence[dict], path: str | Path) -> None:
    """Save a PNG of BFCL average accuracy against measured KV bytes, one line with markers per method
    (sorted by bytes, each marker labelled with its point), full KV as a dashed horizontal line."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    by_method: dict[str, list[tuple[float, float, float]]] = {}
    for entry in sorted(configs, key=_order):
        if entry["status"] == MEASURED and entry["bytes"] is not None:
            by_method.setdefault(entry["method"], []).append((entry["bytes"], entry["accuracy"], entry["point"]))
    fig, ax = plt.subplots(figsize=(9, 5.5), dpi=120)
    colors = plt.get_cmap("tab20")
    markers = "osD^v<>pPX*h"
    names = list(METHODS)
    for method, points in by_method.items():
        points.sort()
        xs, ys, nominal = zip(*points)
        if method == FULL:
            ax.axhline(ys[0], color="black", linestyle="--", linewidth=1, label=f"full KV ({ys[0]:.1f}%)")
            ax.plot(xs, ys, marker="o", color="black", linestyle="none")
            continue
        i = names.index(method) if method in names else len(names)  # one color and marker per method, every page
        style = ":" if method.endswith(("-k4v2", "-2bit")) else "-"  # dotted: what is dropped stays at low bits
        ax.plot(xs, ys, marker=markers[i % len(markers)], linestyle=style, color=colors(2 * i % 20), label=method)
        for x, y, p in zip(xs, ys, nominal):
            ax.annotate(f"{p:g}", (x, y), textcoords="offset points", xytext=(3, 3), fontsize=6)
    ax.set_xlabel("measured KV bytes per request (mean share of full KV)")
    ax.set_ylabel("BFCL AST accuracy, category mean (%)")
    ax.set_xlim(0.0, 1.05)
    ax.set_ylim(0, 100)
    ax.grid(True, alpha=0.3)
    if by_method:
        ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5))
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def merge_configs(records: Sequence[dict], names: Sequence[str]) -> list[dict]:
    """Every configuration of ``records`` (the files ``names``), each once.

    Raises
    ------
    ValueError
        If a configuration appears twice (the message names it and the files).
    """
    seen: dict[tuple[str, float], int] = {}
    configs = []
    for index, (record, name) in enumerate(zip(records, names)):
        for entry in record["configs"]:
            key = _key(entry["method"], entry["point"])
            if key in seen:
                where = f"twice in {name}" if seen[key] == index else f"in {names[seen[key]]} and in {name}"
                raise ValueError(f"{label_of(*key)} appears {where}; keep one (a run to repeat goes in its own page)")
            seen[key] = index
            configs.append(entry)
    return configs


def render(records: Sequence[dict], names: Sequence[str], args: argparse.Namespace) -> None:
    """Print the table; write ``--markdown`` and ``--plot``."""
    configs = merge_configs(records, names)
    rows = report_rows(configs)
    print(format_table(rows))
    if args.markdown:
        Path(args.markdown).write_text(report_markdown(records, names, rows), encoding="utf-8")
    if args.plot:
        plot_frontier(configs, args.plot)


# ------------------------------------------------------------------------------------------------- CLI

LIVE_RUN_FLAGS: tuple[str, ...] = (
    "methods",
    "points",
    "ids",
    "limit",
    "concurrency",
    "max_tokens",
    "grammar",
    "server_args",
    "tier_policy",
    "drop_policy",
    "log_dir",
    "url",
    "label",
    "json",
    "resume",
    "request_timeout",
    "server_timeout",
)
"""Destinations of the flags of a run, refused with ``--from-json``."""
#: Flags that only mean something to servers the bench starts, refused with ``--url``.
STARTING_FLAGS: tuple[str, ...] = (
    "methods",
    "points",
    "server_args",
    "tier_policy",
    "drop_policy",
    "log_dir",
    "server_timeout",
)
#: Settings that shape the answers: a ``--resume`` must run with the file's.
RESUMED_SETTINGS: tuple[str, ...] = ("grammar", "max_tokens", "server_args")


def _positive_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not above 0")
    return value


def build_parser() -> argparse.ArgumentParser:
    """The command-line interface."""
    methods = "\n".join(f"  {m.name:20s}{m.doc}" for m in METHODS.values())
    p = _Parser(
        prog=PROG,
        description=__doc__.split("\n\n")[0].replace("\n", " "),
        epilog=f"methods:\n{methods}",
        formatter_class=_Formatter,
    )
    p.add_argument(
        "--methods",
        nargs="+",
        metavar="METHOD",
        help="methods to run, in this order (None: all, see below); full runs at 1 and sglang-fp8 at 0.5 "
        "whatever --points says",
    )
    p.add_argument(
        "--points", nargs="+", default=list(DEFAULT_POINTS), help="byte points: shares of full KV's bytes, in (0, 1]"
    )
    p.add_argument(
        "--ids",
        help="file of BFCL item ids, one per line (None: "
        f"{DEFAULT_IDS.relative_to(REPO_ROOT)} if present, else the evaluation split)",
    )
    p.add_argument("--limit", type=positive_int, help="at most N items per category, the first ones (smoke runs)")
    p.add_argument("--concurrency", type=positive_int, default=4, help="requests in flight")
    p.add_argument("--max-tokens", type=positive_int, default=256, help="answer length cap (max_new_tokens)")
    p.add_argument("--grammar", choices=CONSTRAINTS, default=DEFAULT_GRAMMAR, help="answer constraint of each item")
    p.add_argument(
        "--server-args",
        default="",
        help="launcher flags added to every configuration, one shell-quoted string (e.g. '--dtype bfloat16'; "
        "flags that start with -- go as --server-args=--dtype ...); the flags the methods set are refused here "
        "(default: %(default)r: the launcher's own defaults)",
    )
    p.add_argument(
        "--tier-policy",
        nargs="+",
        default=[],
        metavar="P=FILE",
        help="pask-tiers' policy file at point P (its --pask-policy there); a point without one gets the "
        "launcher's shipped file for P, or its refusal",
    )
    p.add_argument(
        "--drop-policy",
        nargs="+",
        default=[],
        metavar="P=FILE",
        help="pask-drop's policy file at point P (its --pask-policy there); a point without one gets the "
        "launcher's shipped keep policy",
    )
    p.add_argument("--log-dir", help="folder for the server logs (None: a new temporary folder)")
    p.add_argument(
        "--url",
        help="measure this running server (python -m sglang_pask.launch_server) as one configuration, "
        "named by --label, instead of starting servers",
    )
    p.add_argument("--label", metavar="METHOD@POINT", help="with --url: the configuration it serves, e.g. snapkv@0.25")
    p.add_argument(
        "--json",
        type=output_file,
        help="write the run here, after every configuration (a killed run keeps what finished)",
    )
    p.add_argument(
        "--resume",
        action="store_true",
        help="with --json naming an existing file: keep its configurations and skip them (same "
        "--grammar, --max-tokens and --server-args required)",
    )
    p.add_argument(
        "--from-json",
        nargs="+",
        metavar="JSON",
        help="run nothing: merge these --json files (runs of other sessions) and render them; a "
        "configuration in two files is refused",
    )
    p.add_argument("--markdown", type=output_file, help="write the report here")
    p.add_argument("--plot", type=output_file, help="write the accuracy-against-bytes PNG here")
    p.add_argument(
        "--request-timeout",
        type=_positive_seconds,
        default=900.0,
        help="seconds per request; an answer that takes longer counts as incorrect (request_timeout)",
    )
    p.add_argument(
        "--server-timeout", type=_positive_seconds, default=900.0, help="seconds to wait for a server to start"
    )
    return p


def _records(parser: argparse.ArgumentParser, names: Sequence[str], flag: str) -> list[dict]:
    records = read_json_files(parser, names, flag)
    for name, record in zip(names, records):
        configs = record.get("configs") if isinstance(record, dict) else None
        if not isinstance(configs, list) or not all(
            isinstance(c, dict) and {"method", "point", "status", "items"} <= c.keys() for c in configs
        ):
            parser.error(f'{flag}: {name} is not a {PROG} --json file (no "configs" list of configurations)')
        if not {"command", "date", "machine", "commit"} <= record.keys():
            parser.error(f"{flag}: {name} has no run header (command, date, machine, commit)")
    return records


def _policy_files(
    parser: argparse.ArgumentParser, args: argparse.Namespace, methods: Sequence[str], points: Sequence[float]
) -> dict[str, dict[float, str]]:
    """Per method, the ``--pask-policy`` file of each point its :attr:`Method.policy_option` names (exit 2
    on a malformed pair, a missing file, or a file no configuration of the run would read)."""
    files: dict[str, dict[float, str]] = {}
    for method in METHODS.values():
        if method.policy_option is None:
            continue
        flag = method.policy_option
        for word in getattr(args, flag[2:].replace("-", "_")):
            point_text, eq, name = word.partition("=")
            try:
                point = float(point_text)
            except ValueError:
                point = None
            if not eq or not name or point is None or not 0.0 < point <= 1.0:
                parser.error(f"{flag}: {word!r} is not P=FILE with P in (0, 1] (e.g. 0.25=policy.json)")
            if not Path(name).is_file():
                parser.error(f"{flag}: {word}: no such file: {name}")
            if method.name not in methods:
                parser.error(f"{flag}: {method.name} is not among --methods, so no server would read {name}")
            if round(point, 6) not in {round(x, 6) for x in points}:
                parser.error(f"{flag}: point {point:g} is not among --points")
            files.setdefault(method.name, {})[round(point, 6)] = name
    return files


def _plan(parser: argparse.ArgumentParser, args: argparse.Namespace) -> list[tuple[str, float]]:
    """Check a run's flags; the configurations to run (exit 2 on bad input)."""
    if args.label is not None and args.url is None:
        parser.error("--label names the configuration of a running server: give --url too")
    if args.resume and args.json is None:
        parser.error("--resume keeps the configurations of the --json file: give --json")
    if args.url is not None:
        if args.label is None:
            parser.error("--url: name the configuration the server runs with --label METHOD@POINT (e.g. snapkv@0.25)")
        refuse_flags_given(parser, args, STARTING_FLAGS, "shape the servers the bench starts; --url asks a running one")
        try:
            method, point = parse_config_label(args.label, flag="--label")
        except ValueError:
            parser.error(f"--label: {args.label!r} is not METHOD@POINT (e.g. snapkv@0.25)")
        if method not in METHODS:
            parser.error(f"--label: unknown method {method!r} (methods: {', '.join(METHODS)})")
        if not 0.0 < point <= 1.0:
            parser.error(f"--label: point {point:g} is outside (0, 1]")
        args.policy_files = {}
        return [(method, point)]
    methods = [word for value in args.methods or list(METHODS) for word in value.replace(",", " ").split()]
    unknown = [m for m in methods if m not in METHODS]
    if unknown or not methods:
        parser.error(
            f"--methods: unknown method {unknown[0]!r} (methods: {', '.join(METHODS)})"
            if unknown
            else "--methods: none given"
        )
    try:
        points = parse_budgets(args.points)
    except ValueError as exc:
        parser.error(str(exc).replace("--budgets", "--points").replace("no budget", "no point"))
    args.policy_files = _policy_files(parser, args, methods, points)
    held = [w.split("=", 1)[0] for w in shlex.split(args.server_args) if w.split("=", 1)[0] in METHOD_FLAGS]
    if held:
        parser.error(f"--server-args holds {', '.join(dict.fromkeys(held))}, which the methods set")
    return configurations(methods, points)


def _resumed(parser: argparse.ArgumentParser, path: str, settings: dict) -> dict:
    """What a ``--resume`` keeps of the file ``path``: its configurations, and its run header under
    ``resumed_from`` (with those it resumed itself). Exit 2 if the file is not a run of this bench, or
    was run with other :data:`RESUMED_SETTINGS` (server args compared only where both runs started servers)."""
    (earlier,) = _records(parser, [path], "--resume")
    before = earlier.get("settings") or {}
    differ = [
        key
        for key in RESUMED_SETTINGS
        if before.get(key) is not None and settings[key] is not None and before[key] != settings[key]
    ]
    if differ:
        flags = ", ".join("--" + key.replace("_", "-") for key in differ)
        parser.error(f"--resume: {path} was run with other {flags} ({', '.join(repr(before[k]) for k in differ)})")
    header = {key: earlier[key] for key in ("command", "date", "machine", "commit")}
    return {"resumed_from": [header, *earlier.get("resumed_from", [])], "configs": list(earlier["configs"])}


def _write_json(path: str, record: dict) -> None:
    """Write ``record`` to ``path`` whole (through a temporary file), so a kill never leaves half a file."""
    partial = Path(f"{path}.partial")
    partial.write_text(json.dumps(record, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    os.replace(partial, path)


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Run the benchmark; see ``--help``."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.from_json:
        refuse_flags_given(
            parser,
            args,
            LIVE_RUN_FLAGS,
            "not for --from-json, which runs nothing (it merges the files and renders them)",
        )
        records = _records(parser, args.from_json, "--from-json")
        try:
            merge_configs(records, args.from_json)
        except ValueError as exc:
            parser.error(f"--from-json: {exc}")
        render(records, args.from_json, args)
        return 0
    grid = _plan(parser, args)
    ids = args.ids if args.ids is not None else (str(DEFAULT_IDS) if DEFAULT_IDS.is_file() else None)
    try:
        items = select_items(AST_CATEGORIES, None if ids else "eval", ids, args.limit)
    except (ValueError, FileNotFoundError) as exc:
        parser.error(f"--ids: {exc}" if args.ids else str(exc))
    settings = {
        "items": len(items),
        "ids_file": ids,
        "split": None if ids else "eval",
        "limit": args.limit,
        "grammar": args.grammar,
        "max_tokens": args.max_tokens,
        "concurrency": args.concurrency,
        "server_args": None if args.url else args.server_args,
        "url": args.url,
        "common_flags": None if args.url else list(COMMON_FLAGS),
        "policy_files": {m: {f"{p:g}": name for p, name in files.items()} for m, files in args.policy_files.items()},
    }
    record = {**run_header(PROG, argv), "settings": settings, "complete": False, "configs": []}
    if args.resume and Path(args.json).is_file():
        record.update(_resumed(parser, args.json, settings))
    done = {_key(c["method"], c["point"]) for c in record["configs"]}
    todo = [c for c in grid if _key(*c) not in done]
    for method, point in grid:
        if _key(method, point) in done:
            print(f"{label_of(method, point)}: in {args.json} already, skipped (--resume)", file=sys.stderr)
    print(
        f"{len(items)} items, {len(todo)} configuration(s) to run: {', '.join(label_of(*c) for c in todo)}",
        file=sys.stderr,
    )
    log_dir = None if args.url else Path(args.log_dir or tempfile.mkdtemp(prefix="bench_frontier_logs_"))
    error = None
    for method, point in todo:
        try:
            if args.url is not None:
                entry = measure(args.url.rstrip("/"), method, point, items, args)
            else:
                entry = run_configuration(method, point, items, args, log_dir)
        except FrontierError as exc:
            error = str(exc)
        except requests.RequestException as exc:  # --url: the running server did not answer
            error = f"the {label_of(method, point)} run failed ({type(exc).__name__}: {exc})"
        if error is not None:
            record["error"] = error
            break
        record["configs"].append(entry)
        if args.json:
            _write_json(args.json, record)
    record["complete"] = error is None
    if args.json:
        _write_json(args.json, record)
    if record["configs"]:
        render([record], [args.json or "this run"], args)
    return run_exit_status(
        error,
        "the configurations finished before it are in the table above (and in --json, --markdown, --plot)"
        if record["configs"]
        else None,
    )


if __name__ == "__main__":
    exit_on_sigterm()
    sys.exit(main())
