"""BFCL AST accuracy for KV policies and budgets: ``python -m bench.bfcl``.

Asks a running SGLang server (``--url``), or servers it starts itself, one per (policy, budget),
with ``python -m sglang_pask.launch_server <--server-args> --kv-policy P --kv-budget B`` on a free
port (:class:`sglang_pask.server_process.ServerProcess`, which also kills it afterwards),
BFCL's eight AST categories in BFCL's prompting format (servers it starts run with the radix cache
off unless ``--radix-cache``, so that each item is compressed by its own question and not by the
earlier item that first computed the shared system prompt): greedy, the answer constrained to a Python
call list over the item's functions (``--grammar``: EBNF by default; the equivalent regex costs
xgrammar 11 s to compile for a one-function item and 450 s for a 37-function one with the default
model's 151k-token vocabulary on the 2-core CPU, EBNF 0.1-0.3 s), many requests in flight so that
the server batches them. BFCL's own AST checker scores every answer. Prints a table per configuration
and, against ``--compare-to`` (full KV by default), each configuration's difference in points with its
95% paired bootstrap interval over the items and, item by item, the items only one of the two
answered right with the exact McNemar p; writes the JSON (``--json``), a markdown report
(``--markdown``) and a PNG of average accuracy against budget (``--plot``).

Policy ``full`` keeps every token, so it runs once (budget 1.0) whatever ``--budgets`` says, and is
plotted as a reference line.

``--api tools`` asks through the OpenAI tools path instead: the item's question as it is (no BFCL
system prompt: the chat template renders the tools), its functions as ``tools``
(:func:`sglang_pask.bfcl.tools.openai_tools`, BFCL's types mapped to JSON Schema),
``tool_choice: "required"``, no grammar of the bench's own; the returned ``tool_calls`` are written
as the Python call list BFCL's checker scores, and an answer without tool calls, or with arguments
that are not a JSON object, counts as wrong. Each call's arguments are also checked against its
tool's JSON Schema as strict decoding holds them (:func:`sglang_pask.bfcl.tools.schema_errors`); the
report counts the calls and items off their schema per configuration. The servers need a tool-call
parser (the launcher adds ``--tool-call-parser qwen25`` for the default model); ``--strict-tools``
in ``--server-args`` holds every tool's arguments to its schema.

Examples
--------
Against a running server::

    python -m bench.bfcl --url http://127.0.0.1:30000 --limit 5

Starting servers (one per configuration; an empty ``--server-args`` takes the launcher's defaults:
the embedded default model, the CPU engine when there is no GPU)::

    python -m bench.bfcl --server-args "" --policies full pask --budgets 0.33 0.2 \\
        --split eval --limit 20 --json out.json --plot out.png

PASK with a policy file of its own beside the baselines (``--pask-policy`` reaches the pask servers
only; the launcher refuses it for other policies)::

    python -m bench.bfcl --server-args "--kv-decode keep" --pask-policy policy.json \\
        --policies full pask streaming-llm --budgets 0.28 --split eval --limit 16

Full KV through the tools path, without and with the arguments held to the tools' schemas, then
paired (the second run tagged ``strict``)::

    python -m bench.bfcl --api tools --server-args "" --split eval --limit 8 --json loose.json
    python -m bench.bfcl --api tools --server-args "--strict-tools" --split eval --limit 8 --json strict.json
    python -m bench.bfcl --from-json loose.json strict.json:strict --compare-to full@1 --markdown paired.md

Earlier runs side by side, one run tagged because it had other server flags at the same policy and
budget (its configurations become ``pask-k4v2@0.047`` and so on), only the configurations named::

    python -m bench.bfcl --from-json full.json k4v2.json:k4v2 --only full@1 pask-k4v2@0.047 \
        streaming-llm-k4v2@0.047 --compare-to full@1 streaming-llm-k4v2@0.047
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import platform
import re
import shlex
import sys
import tempfile
import time
from concurrent.futures import as_completed
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable, Sequence

import requests
from tqdm import tqdm

from bench.common import (
    exact_mcnemar_p,
    exit_on_sigterm,
    git_commit,
    read_json_files,
    refuse_flags_given,
    run_exit_status,
)
from sglang_pask.bfcl.checker import check
from sglang_pask.bfcl.constraints import CONSTRAINTS, answer_constraint
from sglang_pask.bfcl.data import AST_CATEGORIES, BfclItem, check_categories, load_items
from sglang_pask.bfcl.prompt import build_messages
from sglang_pask.bfcl.report import (
    ConfigResult,
    ItemResult,
    configs_from_record,
    format_differences,
    format_table,
    plot_accuracy_vs_budget,
)
from sglang_pask.bfcl.split import SPLITS, read_ids_file, select_by_ids, split_items
from sglang_pask.bfcl.tools import answer_text, openai_tools, schema_errors, tool_calls_of
from sglang_pask.cli_paths import output_file
from sglang_pask.request_pool import request_pool
from sglang_pask.server_process import ServerProcess, ServerStartError

REPO_ROOT = Path(__file__).resolve().parents[1]
FULL_POLICY = "full"
PASK_POLICY = "pask"
#: How items are asked (``--api``): BFCL's prompt with the bench's answer grammar, or OpenAI tools.
GRAMMAR_API = "grammar"
TOOLS_API = "tools"
APIS: tuple[str, ...] = (GRAMMAR_API, TOOLS_API)
#: ``--grammar`` when none is given (grammar API).
DEFAULT_GRAMMAR = "ebnf"
LIVE_RUN_FLAGS: tuple[str, ...] = (
    "api",
    "categories",
    "limit",
    "ids",
    "split",
    "policies",
    "budgets",
    "grammar",
    "concurrency",
    "max_tokens",
    "request_timeout",
    "port",
    "server_timeout",
    "radix_cache",
    "log_dir",
    "pask_policy",
)
"""Destinations of the flags that shape a run only, refused with ``--from-json``."""


def _split_words(values: Sequence[str]) -> list[str]:
    """Accept both ``a b`` and ``a,b`` for list options."""
    return [word for value in values for word in value.replace(",", " ").split()]


def parse_budgets(values: Sequence[str]) -> list[float]:
    """Parse ``--budgets``: fractions of full KV in (0, 1].

    Parameters
    ----------
    values : sequence of str
        E.g. ``["0.33", "0.2"]`` or ``["0.33,0.2"]``.

    Returns
    -------
    list of float
        The budgets, duplicates removed, in the given order.

    Raises
    ------
    ValueError
        If a value is not a number in (0, 1] or none is given.
    """
    budgets = []
    for word in _split_words(values):
        try:
            budget = float(word)
        except ValueError:
            raise ValueError(f"--budgets: {word!r} is not a number") from None
        if not 0.0 < budget <= 1.0:
            raise ValueError(f"--budgets: {word} is outside (0, 1]")
        budgets.append(budget)
    if not budgets:
        raise ValueError("--budgets: no budget given")
    return list(dict.fromkeys(budgets))


def configurations(policies: Sequence[str], budgets: Sequence[float]) -> list[tuple[str, float]]:
    """The (policy, budget) grid; ``full`` appears once, at budget 1.0.

    Parameters
    ----------
    policies : sequence of str
        Policy names.
    budgets : sequence of float
        Budgets for the compressing policies.

    Returns
    -------
    list of (str, float)
        The configurations to run, in order.
    """
    grid: list[tuple[str, float]] = []
    for policy in dict.fromkeys(policies):
        grid.extend([(policy, 1.0)] if policy == FULL_POLICY else [(policy, b) for b in budgets])
    return grid


def select_items(
    categories: Sequence[str], split: str | None, ids_file: str | None, limit: int | None
) -> list[BfclItem]:
    """Choose the items to evaluate.

    Parameters
    ----------
    categories : sequence of str
        AST categories to load.
    split : {"eval", "calib"} or None
        Keep only this split (applied before ``limit``).
    ids_file : str or None
        Evaluate exactly the ids in this file (one per line), in file order.
    limit : int or None
        At most this many items per category (the first ones, in file order).

    Returns
    -------
    list of BfclItem
        The selection.

    Raises
    ------
    ValueError
        On bad input or an empty selection.
    """
    items = load_items(categories)
    if ids_file is not None:
        items = select_by_ids(items, read_ids_file(ids_file))
    if split is not None:
        items = split_items(items, split)
    if limit is not None:
        if limit < 1:
            raise ValueError(f"--limit must be at least 1, got {limit}")
        taken: dict[str, int] = {}
        kept = []
        for item in items:
            if taken.get(item.category, 0) < limit:
                taken[item.category] = taken.get(item.category, 0) + 1
                kept.append(item)
        items = kept
    if not items:
        raise ValueError("the selection is empty (check --categories, --ids and --split)")
    return items


# ItemResult.error_type of an item whose request timed out.
TIMEOUT_ERROR = "request_timeout"


def served_model(url: str) -> str:
    """Return the id of the model a server serves (``/v1/models``)."""
    response = requests.get(f"{url}/v1/models", timeout=30)
    response.raise_for_status()
    return response.json()["data"][0]["id"]


def ask(url: str, model: str, item: BfclItem, grammar: str, max_tokens: int, timeout_s: float) -> ItemResult:
    """Send one item to ``/v1/chat/completions`` (greedy, constrained) and check the answer.

    Parameters
    ----------
    url : str
        Server base URL.
    model : str
        Served model id.
    item : BfclItem
        The item.
    grammar : {"regex", "ebnf", "ebnf-strict", "none"}
        The constraint sent with the request (:data:`sglang_pask.bfcl.constraints.CONSTRAINTS`).
    max_tokens : int
        Answer length cap.
    timeout_s : float
        Request timeout. An item whose answer does not come back in time counts as incorrect, with
        error type :data:`TIMEOUT_ERROR` and an empty output (the run goes on: one slow answer on
        a loaded machine must not lose every other result).

    Returns
    -------
    ItemResult
        The answer and BFCL's verdict.

    Raises
    ------
    requests.HTTPError
        If the server rejects the request.
    """
    body = {
        "model": model,
        "messages": build_messages(item),
        "temperature": 0.0,
        "max_tokens": max_tokens,
    }
    body.update(answer_constraint(item, grammar))
    reply = _post_chat(url, item, body, timeout_s)
    if isinstance(reply, ItemResult):
        return reply
    payload, latency = reply
    choice = payload["choices"][0]
    text = choice["message"].get("content") or ""
    verdict = check(item, text)
    return _item_result(item, payload, latency, text, verdict.valid, verdict.error_type)


def _post_chat(url: str, item: BfclItem, body: dict, timeout_s: float) -> tuple[dict, float] | ItemResult:
    """POST ``body`` to ``/v1/chat/completions``: the response and its latency, or the result of an
    item that timed out (counted as incorrect, error type :data:`TIMEOUT_ERROR`, empty output).

    Raises
    ------
    requests.HTTPError
        If the server rejects the request.
    """
    start = time.perf_counter()
    try:
        response = requests.post(f"{url}/v1/chat/completions", json=body, timeout=timeout_s)
    except requests.Timeout:
        print(f"{item.id}: no answer within --request-timeout {timeout_s:g} s; counted as incorrect", file=sys.stderr)
        return ItemResult(
            id=item.id,
            category=item.category,
            output="",
            valid=False,
            error_type=TIMEOUT_ERROR,
            latency_s=time.perf_counter() - start,
            prompt_tokens=0,
            completion_tokens=0,
            finish_reason="timeout",
        )
    latency = time.perf_counter() - start
    if response.status_code != 200:
        raise requests.HTTPError(f"{item.id}: HTTP {response.status_code}: {response.text[:500]}")
    return response.json(), latency


def _item_result(
    item: BfclItem, payload: dict, latency: float, output: str, valid: bool, error_type: str
) -> ItemResult:
    usage = payload.get("usage") or {}
    return ItemResult(
        id=item.id,
        category=item.category,
        output=output,
        valid=valid,
        error_type=error_type,
        latency_s=latency,
        prompt_tokens=int(usage.get("prompt_tokens", 0)),
        completion_tokens=int(usage.get("completion_tokens", 0)),
        finish_reason=str(payload["choices"][0].get("finish_reason")),
    )


# ItemResult.error_type of a tools-mode answer that BFCL's checker never saw.
NO_TOOL_CALLS_ERROR = "tools:no_tool_calls"
UNPARSABLE_ARGUMENTS_ERROR = "tools:unparsable_arguments"


def ask_tools(url: str, model: str, item: BfclItem, max_tokens: int, timeout_s: float) -> tuple[ItemResult, list[dict]]:
    """Send one item through the OpenAI tools path (greedy, ``tool_choice: "required"``) and check the
    returned calls.

    Parameters
    ----------
    url : str
        Server base URL (run with a tool-call parser).
    model : str
        Served model id.
    item : BfclItem
        The item.
    max_tokens : int
        Answer length cap.
    timeout_s : float
        Request timeout; an item past it counts as incorrect (as in :func:`ask`).

    Returns
    -------
    ItemResult
        The calls as a Python call list (:func:`sglang_pask.bfcl.tools.answer_text`) and BFCL's
        verdict on it. No tool calls: incorrect, error type :data:`NO_TOOL_CALLS_ERROR`, the
        message's text as output; arguments that are not a JSON object: incorrect,
        :data:`UNPARSABLE_ARGUMENTS_ERROR`, the calls as JSON.
    list of dict
        Each returned call: ``name``, ``arguments`` (the text the server sent) and ``schema_errors``
        (empty when the arguments hold to the tool's schema, :func:`sglang_pask.bfcl.tools.schema_errors`).

    Raises
    ------
    requests.HTTPError
        If the server rejects the request.
    """
    tools = openai_tools(item)
    body = {
        "model": model,
        "messages": copy.deepcopy(item.messages),
        "tools": tools,
        "tool_choice": "required",
        "temperature": 0.0,
        "max_tokens": max_tokens,
    }
    reply = _post_chat(url, item, body, timeout_s)
    if isinstance(reply, ItemResult):
        return reply, []
    payload, latency = reply
    message = payload["choices"][0]["message"]
    calls = tool_calls_of(message)
    records = [{"name": c.name, "arguments": c.arguments, "schema_errors": schema_errors(tools, c)} for c in calls]
    if not calls:
        return _item_result(item, payload, latency, message.get("content") or "", False, NO_TOOL_CALLS_ERROR), records
    try:
        text = answer_text(calls)
    except ValueError:
        raw = json.dumps([{"name": c.name, "arguments": c.arguments} for c in calls], ensure_ascii=False)
        return _item_result(item, payload, latency, raw, False, UNPARSABLE_ARGUMENTS_ERROR), records
    verdict = check(item, text)
    return _item_result(item, payload, latency, text, verdict.valid, verdict.error_type), records


@dataclass
class ToolsConfigResult(ConfigResult):
    """A configuration asked through the OpenAI tools path.

    Attributes
    ----------
    tool_calls : dict of str to list of dict
        Per item id, the calls returned (:func:`ask_tools`).
    """

    tool_calls: dict[str, list[dict]] = field(default_factory=dict)


def run_config(
    url: str, policy: str, budget: float, items: Sequence[BfclItem], args: argparse.Namespace
) -> ConfigResult:
    """Ask every item concurrently against one server.

    Parameters
    ----------
    url : str
        Server base URL.
    policy, budget : str, float
        The configuration (labels of the result).
    items : sequence of BfclItem
        Items to ask.
    args : argparse.Namespace
        ``api``, ``concurrency``, ``grammar``, ``max_tokens``, ``request_timeout``.

    Returns
    -------
    ConfigResult
        Results in the order of ``items``; a :class:`ToolsConfigResult` with ``--api tools``.
    """
    model = served_model(url)
    results: dict[str, ItemResult] = {}
    tool_calls: dict[str, list[dict]] = {}
    tools = args.api == TOOLS_API
    start = time.perf_counter()
    with request_pool(args.concurrency) as pool:
        futures = [
            pool.submit(ask_tools, url, model, item, args.max_tokens, args.request_timeout)
            if tools
            else pool.submit(ask, url, model, item, args.grammar, args.max_tokens, args.request_timeout)
            for item in items
        ]
        with tqdm(total=len(futures), desc=f"{policy}@{budget:g}", unit="item") as bar:
            for future in as_completed(futures):
                result = future.result()
                if tools:
                    result, tool_calls[result.id] = result
                results[result.id] = result
                bar.update(1)
                bar.set_postfix(correct=sum(r.valid for r in results.values()))
    wall = time.perf_counter() - start
    ordered = [results[item.id] for item in items]
    server = {"url": url, "model": model}
    if tools:
        calls = {item.id: tool_calls[item.id] for item in items}
        return ToolsConfigResult(policy, budget, ordered, wall_s=wall, server=server, tool_calls=calls)
    return ConfigResult(policy=policy, budget=budget, items=ordered, wall_s=wall, server=server)


def server_flags(
    server_args: str, policy: str, budget: float, radix_cache: bool, pask_policy: str | None = None
) -> list[str]:
    """Launcher arguments of one configuration's server: ``server_args`` (shell syntax), the policy and
    budget, ``--pask-policy pask_policy`` for the ``pask`` configurations only (the launcher refuses it
    for every other policy), and ``--disable-radix-cache`` unless ``radix_cache`` (or ``server_args``
    already has it)."""
    flags = [*shlex.split(server_args), "--kv-policy", policy, "--kv-budget", f"{budget:g}"]
    if pask_policy is not None and policy == PASK_POLICY:
        flags += ["--pask-policy", pask_policy]
    if not radix_cache and "--disable-radix-cache" not in flags:
        flags.append("--disable-radix-cache")
    return flags


def machine_info() -> dict[str, str | int]:
    """``uname -a``, CPU count and Python version of this machine."""
    return {
        "uname": " ".join(platform.uname()),
        "nproc": os.cpu_count() or 0,
        "python": platform.python_version(),
    }


def build_parser() -> argparse.ArgumentParser:
    """The command-line interface."""
    p = argparse.ArgumentParser(
        prog="python -m bench.bfcl",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    where = p.add_mutually_exclusive_group()
    where.add_argument("--url", help="a running server (then one policy and budget: labels only)")
    where.add_argument("--server-args", help="start servers with these launcher arguments (shell syntax)")
    where.add_argument(
        "--from-json",
        nargs="+",
        metavar="JSON[:TAG]",
        help="run nothing: re-render table, --markdown and --plot from these --json files "
        "(several runs are shown side by side; one configuration's runs over disjoint "
        "items are pooled); JSON:TAG names that file's configurations POLICY-TAG@BUDGET "
        "(e.g. runs with other server flags at the same policy and budget: "
        "k4v2.json:k4v2 gives pask-k4v2@0.047, for --compare-to too); the flags that only "
        "shape a run (--limit, --policies ...) are refused with it",
    )
    p.add_argument("--categories", nargs="+", default=list(AST_CATEGORIES), help="AST categories")
    p.add_argument("--limit", type=int, help="at most N items per category (first in file order)")
    p.add_argument("--ids", help="file of item ids (one per line) to evaluate exactly")
    p.add_argument("--split", choices=SPLITS, help="only the evaluation or the calibration split")
    p.add_argument("--policies", nargs="+", default=[FULL_POLICY], help="KV policies")
    p.add_argument("--budgets", nargs="+", default=["0.33", "0.2"], help="KV budgets in (0, 1]")
    p.add_argument(
        "--api",
        choices=APIS,
        default=GRAMMAR_API,
        help="grammar: BFCL's prompt (function docs in the system prompt), the answer a Python call list "
        "constrained by --grammar; tools: the OpenAI tools path (the functions as tools, tool_choice "
        "required, the returned tool_calls scored; the servers need a tool-call parser)",
    )
    p.add_argument(
        "--grammar",
        choices=CONSTRAINTS,
        help=f"answer constraint of --api grammar (None: {DEFAULT_GRAMMAR}; regex: same language as ebnf, "
        "but 10-450 s to compile per item on CPU; ebnf-strict: the function docs enforced as strict tools: "
        "declared order, required arguments, value types and enums, see sglang_pask.bfcl.strict_grammar)",
    )
    p.add_argument(
        "--pask-policy",
        metavar="JSON",
        help="PASK policy file of the pask servers only (None: the launcher's default, the file shipped "
        "for the served model); the launcher refuses --pask-policy for other policies, so with "
        "several policies it goes here and not in --server-args",
    )
    p.add_argument("--concurrency", type=int, default=4, help="requests in flight")
    p.add_argument("--max-tokens", type=int, default=256, help="answer length cap")
    p.add_argument(
        "--request-timeout",
        type=float,
        default=900.0,
        help="seconds per request; an answer that takes longer counts as incorrect (request_timeout)",
    )
    p.add_argument("--port", type=int, help="server port when starting servers (None: a free one each time)")
    p.add_argument("--server-timeout", type=float, default=900.0, help="seconds to wait for /health")
    p.add_argument(
        "--radix-cache",
        action="store_true",
        help="keep SGLang's radix prefix cache on in the servers started (off by default: then every "
        "item's KV is compressed by its own question; with it on, a compressed request reads a "
        "shared prefix, such as BFCL's system prompt, as the request that first computed it kept it, "
        "so answers depend on the order the items ran in)",
    )
    p.add_argument("--log-dir", help="folder for server logs (None: a new temporary folder)")
    p.add_argument("--json", type=output_file, help="write all results here")
    p.add_argument("--markdown", type=output_file, help="write a markdown report here")
    p.add_argument("--plot", type=output_file, help="write the accuracy-vs-budget PNG here")
    p.add_argument(
        "--only",
        nargs="+",
        metavar="POLICY@BUDGET",
        help="with --from-json: show only these configurations (after tags), in this order; the "
        "files may hold others, over other items",
    )
    p.add_argument(
        "--compare-to",
        nargs="+",
        metavar="POLICY@BUDGET",
        help="configurations (e.g. full@1 streaming-llm@0.28) that every configuration is compared "
        "with: the difference of the averages in points and its 95%% interval by a paired, "
        "per-category bootstrap over the items (default: full@1 when it ran)",
    )
    return p


def parse_config_label(word: str, flag: str = "--compare-to") -> tuple[str, float]:
    """``"snapkv@0.28"`` -> ``("snapkv", 0.28)``.

    Raises
    ------
    ValueError
        If ``word`` is not ``POLICY@BUDGET`` with a number for the budget.
    """
    policy, at, budget = word.rpartition("@")
    try:
        if not policy or not at:
            raise ValueError
        return policy, float(budget)
    except ValueError:
        raise ValueError(f"{flag}: {word!r} is not POLICY@BUDGET (e.g. full@1, snapkv@0.28)") from None


def comparison_references(configs: Sequence[ConfigResult], labels: Sequence[str] | None) -> list[ConfigResult]:
    """The configurations named by ``--compare-to`` (``None``: ``full`` when it is among ``configs``).

    Raises
    ------
    ValueError
        If a label is malformed or names no configuration of ``configs``.
    """
    if labels is None:
        return [c for c in configs if c.policy == FULL_POLICY][:1]
    references = []
    for word in labels:
        policy, budget = parse_config_label(word)
        found = [c for c in configs if c.policy == policy and abs(c.budget - budget) < 1e-9]
        if not found:
            raise ValueError(
                f"--compare-to: {word} is not among the configurations ({', '.join(c.label for c in configs)})"
            )
        references.append(found[0])
    return references


def _check_pask_policy(args: argparse.Namespace, policies: Sequence[str]) -> None:
    """Refuse a PASK policy file that no server would read, or one placed where the launcher refuses it.

    Raises
    ------
    ValueError
        If ``--pask-policy`` is given with ``--url`` (the running server has its policy), without
        ``pask`` among ``policies``, or names no file; or if ``--server-args`` holds ``--pask-policy``
        while a policy other than ``pask`` runs.
    """
    if args.pask_policy is not None:
        if args.url is not None:
            raise ValueError("--pask-policy: a running server (--url) has its policy already")
        if PASK_POLICY not in policies:
            raise ValueError(f"--pask-policy: no pask configuration to use it (--policies {' '.join(policies)})")
        if not Path(args.pask_policy).is_file():
            raise ValueError(f"--pask-policy: no such file: {args.pask_policy}")
    others = [p for p in policies if p != PASK_POLICY]
    if (
        args.server_args is not None
        and others
        and any(flag == "--pask-policy" or flag.startswith("--pask-policy=") for flag in shlex.split(args.server_args))
    ):
        raise ValueError(
            f"--server-args holds --pask-policy, which the launcher refuses for {', '.join(others)}: "
            f"give it as the bench's own --pask-policy (used by the pask servers only)"
        )


def _validate(args: argparse.Namespace) -> tuple[list[str], list[float]]:
    args.categories = list(check_categories(_split_words(args.categories)))
    if args.api == TOOLS_API and args.grammar is not None:
        raise ValueError("--grammar: --api tools sends no grammar of its own (the server's tool_choice constrains)")
    if args.api == GRAMMAR_API and args.grammar is None:
        args.grammar = DEFAULT_GRAMMAR
    policies = _split_words(args.policies)
    if not policies:
        raise ValueError("--policies: no policy given")
    budgets = parse_budgets(args.budgets)
    if args.concurrency < 1:
        raise ValueError(f"--concurrency must be at least 1, got {args.concurrency}")
    if args.max_tokens < 1:
        raise ValueError(f"--max-tokens must be at least 1, got {args.max_tokens}")
    if args.url is None and args.server_args is None:
        raise ValueError("give --url (a running server), --server-args (start servers) or --from-json")
    _check_pask_policy(args, policies)
    if args.url is not None and len(configurations(policies, budgets)) != 1:
        raise ValueError("with --url the server has one configuration: give one policy and one budget")
    if args.compare_to is not None:
        comparison_references([ConfigResult(p, b) for p, b in configurations(policies, budgets)], args.compare_to)
    return policies, budgets


def config_entry(config: ConfigResult) -> dict:
    """A configuration as a ``--json`` record holds it: its scores and every answer (and, asked through
    the tools path, ``tool_calls``: per item id, the calls returned with their schema errors)."""
    entry = {
        "policy": config.policy,
        "budget": config.budget,
        "average": config.average(),
        "categories": {k: {"n": s.n, "correct": s.correct, "accuracy": s.accuracy} for k, s in config.scores().items()},
        "wall_s": config.wall_s,
        "server": config.server,
        "items": [r.__dict__ for r in config.items],
    }
    if isinstance(config, ToolsConfigResult):
        entry["tool_calls"] = config.tool_calls
    return entry


def configs_of_record(record: dict) -> list[ConfigResult]:
    """:func:`sglang_pask.bfcl.report.configs_from_record`, a configuration with ``tool_calls`` as a
    :class:`ToolsConfigResult`."""
    configs = configs_from_record(record)
    for i, (config, entry) in enumerate(zip(configs, record["configs"])):
        if "tool_calls" in entry:
            configs[i] = ToolsConfigResult(**config.__dict__, tool_calls=dict(entry["tool_calls"]))
    return configs


def format_schema_table(configs: Sequence[ConfigResult]) -> str:
    """Markdown table of the tools-path configurations (:class:`ToolsConfigResult`): items answered
    without a tool call or with arguments that are not a JSON object, the calls returned, the calls
    whose arguments break their tool's schema and the items with at least one such call; ``""`` when
    no configuration went through the tools path."""
    tools = [c for c in configs if isinstance(c, ToolsConfigResult)]
    if not tools:
        return ""
    lines = [
        "| config | items | no tool call | unparsable arguments | calls | calls off schema | items with a call off schema |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for c in tools:
        calls = [call for item_calls in c.tool_calls.values() for call in item_calls]
        off = sum(bool(call["schema_errors"]) for call in calls)
        items_off = sum(any(call["schema_errors"] for call in item_calls) for item_calls in c.tool_calls.values())
        errors = [r.error_type for r in c.items]
        lines.append(
            f"| {c.label} | {len(c.items)} | {errors.count(NO_TOOL_CALLS_ERROR)} | "
            f"{errors.count(UNPARSABLE_ARGUMENTS_ERROR)} | {len(calls)} | {off} | {items_off} |"
        )
    return "\n".join(lines)


RUN_TAG = re.compile(r"[A-Za-z0-9_.+-]+")
"""What may follow ``JSON:`` in ``--from-json`` (no ``/``, ``@`` or ``:``)."""


def split_run_tag(word: str) -> tuple[str, str | None]:
    """``"runs/k4v2.json:k4v2"`` -> ``("runs/k4v2.json", "k4v2")``; a word without a tag, or one that is
    itself an existing file's name, -> ``(word, None)``.

    Raises
    ------
    ValueError
        If the text after the last ``:`` is empty.
    """
    name, colon, tag = word.rpartition(":")
    if not colon or Path(word).is_file():
        return word, None
    if not tag:
        raise ValueError(f"{word!r} ends with ':' but names no tag (JSON:TAG, e.g. runs.json:k4v2)")
    return (name, tag) if RUN_TAG.fullmatch(tag) else (word, None)


def tag_record(record: dict, tag: str | None) -> dict:
    """``record`` with each configuration's policy renamed ``POLICY-TAG`` (``tag`` None: unchanged), so
    that runs of one policy and budget under different server flags stay apart when merged."""
    if tag is None:
        return record
    return {**record, "configs": [{**c, "policy": f"{c['policy']}-{tag}"} for c in record["configs"]]}


def only_configs(records: Sequence[dict], labels: Sequence[str]) -> tuple[list[dict], Callable[[dict], int]]:
    """``records`` holding only the configurations named by ``labels`` (``POLICY@BUDGET``; records
    left with none are dropped), and the key that sorts configurations into the order of ``labels``.

    Raises
    ------
    ValueError
        If a label is malformed or names no configuration of any record.
    """
    wanted = [parse_config_label(word, flag="--only") for word in labels]

    def rank(config: dict) -> int:
        return next(
            (
                i
                for i, (policy, budget) in enumerate(wanted)
                if config["policy"] == policy and abs(config["budget"] - budget) < 1e-9
            ),
            -1,
        )

    found = {rank(c) for record in records for c in record["configs"]}
    missing = [labels[i] for i in range(len(wanted)) if i not in found]
    if missing:
        present = dict.fromkeys(f"{c['policy']}@{c['budget']:g}" for record in records for c in record["configs"])
        raise ValueError(f"--only: {', '.join(missing)} in none of the files ({', '.join(present)})")
    kept = [{**r, "configs": [c for c in r["configs"] if rank(c) >= 0]} for r in records]
    return [r for r in kept if r["configs"]], rank


def merge_records(records: Sequence[dict]) -> dict:
    """One record holding the configurations of several runs.

    Runs over the same items are shown side by side; the runs of one configuration over disjoint
    items (batches of the same evaluation) are pooled into one configuration: its items in run
    order, its wall time summed. Every configuration must end with the same items.

    Parameters
    ----------
    records : sequence of dict
        ``--json`` records, each with its ``command``, ``date``, ``commit`` and ``configs``.

    Returns
    -------
    dict
        The first record's settings with ``n_items`` and ``categories`` of the pooled items, every
        configuration in order of first appearance, and ``runs``: each record's command, date,
        commit and machine.

    Raises
    ------
    ValueError
        If a configuration answered an item in more than one run, or the configurations did not
        end with the same items.
    """
    pooled: dict[tuple[str, float], dict] = {}
    for record in records:
        for config in record["configs"]:
            key = (config["policy"], config["budget"])
            found = pooled.get(key)
            if found is None:
                pooled[key] = {**config, "items": list(config["items"])}
                continue
            seen = {item["id"] for item in found["items"]}
            twice = [item["id"] for item in config["items"] if item["id"] in seen]
            if twice:
                raise ValueError(
                    f"configuration {key[0]}@{key[1]:g} answered {twice[0]} in more than one run "
                    f"({len(twice)} items twice)"
                )
            found["items"].extend(config["items"])
            found["wall_s"] = found["wall_s"] + config["wall_s"]
            if "tool_calls" in found or "tool_calls" in config:
                found["tool_calls"] = {**found.get("tool_calls", {}), **config.get("tool_calls", {})}
    configs = list(pooled.values())
    for config in configs[1:]:
        if sorted(i["id"] for i in config["items"]) != sorted(i["id"] for i in configs[0]["items"]):
            raise ValueError(
                f"configuration {config['policy']}@{config['budget']:g} answered other items than "
                f"{configs[0]['policy']}@{configs[0]['budget']:g}"
            )
    merged = dict(records[0])
    merged["configs"] = [config_entry(c) for c in configs_of_record({"configs": configs})]
    merged["n_items"] = len(configs[0]["items"]) if configs else 0
    merged["categories"] = list(dict.fromkeys(c for record in records for c in record["categories"]))
    for key in ("split", "ids_file", "limit"):  # what chose the items: one value, or see "runs"
        if any(record.get(key) != merged.get(key) for record in records):
            merged[key] = None
    if any(_api_of(record) != _api_of(merged) for record in records):
        merged["api"], merged["grammar"] = "mixed", None
    merged["runs"] = [{key: record[key] for key in ("command", "date", "commit", "machine")} for record in records]
    return merged


def _run_lines(record: dict) -> list[str]:
    runs = record.get("runs") or [record]
    if len(runs) == 1:
        run = runs[0]
        return [
            f"- command: `{run['command']}`",
            f"- date: {run['date']}",
            f"- machine: {run['machine']['uname']}; nproc {run['machine']['nproc']}",
            f"- commit: {run['commit']}",
        ]
    lines = [f"- {len(runs)} runs, side by side (a configuration's runs over other items pooled):"]
    for run in runs:
        lines.append(
            f"  - `{run['command']}` ({run['date']}, commit {run['commit']}, "
            f"{run['machine']['uname']}; nproc {run['machine']['nproc']})"
        )
    return lines


def _api_of(record: dict) -> str:
    """How a record's items were asked (records older than ``--api`` used the grammar API)."""
    return record.get("api") or GRAMMAR_API


def _asked_how(record: dict) -> str:
    api = _api_of(record)
    if api == TOOLS_API:
        return 'OpenAI tools (tool_choice "required", the returned tool_calls scored)'
    if api == GRAMMAR_API:
        return f"grammar {record['grammar']}"
    return "grammar and OpenAI tools runs side by side (see the commands)"


# How the report names the servers' radix cache setting (absent from records older than the flag).
_RADIX_NOTE = {True: ", radix cache on", False: ", radix cache off"}


# Coverage of the --compare-to intervals.
COMPARISON_LEVEL = 0.95


def disagreements(config: ConfigResult, reference: ConfigResult) -> tuple[int, int]:
    """Items only ``config`` answered right, and items only ``reference`` did, paired by item id.

    Raises
    ------
    ValueError
        If the two did not answer the same items.
    """
    mine = {r.id: r.valid for r in config.items}
    theirs = {r.id: r.valid for r in reference.items}
    if mine.keys() != theirs.keys():
        raise ValueError(
            f"{config.label} and {reference.label} did not answer the same items, so their answers cannot be paired"
        )
    only_mine = sum(valid and not theirs[item] for item, valid in mine.items())
    only_theirs = sum(valid and not mine[item] for item, valid in theirs.items())
    return only_mine, only_theirs


def format_item_by_item(configs: Sequence[ConfigResult], references: Sequence[ConfigResult]) -> str:
    """Markdown table: per configuration and reference, the items only one of the two answered right
    (``only this : only the reference``) and the exact two-sided McNemar p of that split
    (:func:`bench.common.exact_mcnemar_p`); a configuration is not compared with itself (``-``)."""
    lines = [
        "| config | " + " | ".join(f"against {ref.label}" for ref in references) + " |",
        "|---|" + "---:|" * len(references),
    ]
    for config in configs:
        cells = []
        for ref in references:
            if config is ref:
                cells.append("-")
                continue
            only_config, only_ref = disagreements(config, ref)
            cells.append(f"{only_config} : {only_ref} (p = {exact_mcnemar_p(only_config, only_ref):.2g})")
        lines.append(f"| {config.label} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _differences_lines(configs: Sequence[ConfigResult], references: Sequence[ConfigResult]) -> list[str]:
    """The --compare-to tables (differences of the averages, then item by item) under their headings,
    each followed by a blank line; nothing when there is nothing to compare."""
    if not references or len(configs) < 2:
        return []
    return [
        f"Difference of the averages in points, [{COMPARISON_LEVEL:.0%} interval] by a paired bootstrap "
        "that redraws each category's items:",
        "",
        format_differences(configs, references, COMPARISON_LEVEL),
        "",
        "Item by item: items only the row's configuration answered right : items only the column's did "
        "(exact two-sided McNemar p; a small p says more than the luck of the items drawn):",
        "",
        format_item_by_item(configs, references),
        "",
    ]


def _schema_lines(configs: Sequence[ConfigResult]) -> list[str]:
    """The tools path's schema table (:func:`format_schema_table`) under its heading, followed by a blank
    line; nothing when no configuration went through the tools path."""
    table = format_schema_table(configs)
    if not table:
        return []
    return [
        "Tool calls: items answered without one or with arguments that are not a JSON object (both "
        "scored wrong), and calls whose arguments break their tool's JSON Schema as strict decoding "
        "holds them (an object that lists properties admits no others; formats checked):",
        "",
        table,
        "",
    ]


def _report_markdown(record: dict, configs: Sequence[ConfigResult], references: Sequence[ConfigResult]) -> str:
    lines = [
        f"# BFCL AST accuracy ({record['date']})",
        "",
        *_run_lines(record),
        f"- items: {record['n_items']} ({', '.join(record['categories'])}); {_asked_how(record)}, "
        f"greedy, max tokens {record['max_tokens']}, concurrency {record['concurrency']}"
        f"{_RADIX_NOTE.get(record.get('radix_cache'), '')}",
        *([f"- **incomplete**: {record['error'].splitlines()[0]}"] if record.get("error") else []),
        "",
        "Accuracy in % (correct/n) by BFCL's AST checker; average = unweighted mean over categories.",
        "",
        format_table(configs),
        "",
        *_differences_lines(configs, references),
        *_schema_lines(configs),
        "| config | wall s | mean latency s | mean prompt tokens | mean answer tokens |",
        "|---|---:|---:|---:|---:|",
    ]
    for c in configs:
        n = len(c.items)
        lines.append(
            f"| {c.label} | {c.wall_s:.0f} | {sum(r.latency_s for r in c.items) / n:.1f} | "
            f"{sum(r.prompt_tokens for r in c.items) / n:.0f} | {sum(r.completion_tokens for r in c.items) / n:.1f} |"
        )
    return "\n".join(lines) + "\n"


def _render(record: dict, configs: Sequence[ConfigResult], args: argparse.Namespace) -> None:
    print(format_table(configs))
    try:
        references = comparison_references(configs, args.compare_to)
    except ValueError as exc:  # a reference whose run failed: say so, report the rest
        print(exc)
        references = []
    differences = _differences_lines(configs, references)
    if differences:
        print("\n" + "\n".join(differences).rstrip())
    schema = _schema_lines(configs)
    if schema:
        print("\n" + "\n".join(schema).rstrip())
    if args.markdown:
        Path(args.markdown).write_text(_report_markdown(record, configs, references), encoding="utf-8")
    if args.plot:
        plot_accuracy_vs_budget(configs, args.plot)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmark; see ``--help``."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.only is not None and not args.from_json:
        parser.error("--only: chooses among --from-json's configurations; for a run, --policies and --budgets do")
    if args.from_json:
        refuse_flags_given(
            parser,
            args,
            LIVE_RUN_FLAGS,
            "only shape a run; --from-json runs nothing (it re-renders the answers the files hold)",
        )
        try:
            sources = [split_run_tag(word) for word in args.from_json]
        except ValueError as exc:
            parser.error(f"--from-json: {exc}")
        records = read_json_files(parser, [name for name, _ in sources])
        for (name, _), r in zip(sources, records):
            if not isinstance(r, dict) or not isinstance(r.get("configs"), list):
                parser.error(f'--from-json: {name} is not a python -m bench.bfcl --json file (no "configs" list)')
        records = [tag_record(r, tag) for r, (_, tag) in zip(records, sources)]
        rank = None
        if args.only is not None:
            try:
                records, rank = only_configs(records, args.only)
            except ValueError as exc:
                parser.error(str(exc))
        try:
            record = merge_records(records)
        except ValueError as exc:
            parser.error(f"--from-json: {exc}")
        if rank is not None:
            record["configs"].sort(key=rank)
        try:
            comparison_references(configs_of_record(record), args.compare_to)
        except ValueError as exc:
            parser.error(str(exc))
        if args.json:
            Path(args.json).write_text(json.dumps(record, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
        _render(record, configs_of_record(record), args)
        return 0
    try:
        policies, budgets = _validate(args)
        items = select_items(args.categories, args.split, args.ids, args.limit)
    except (ValueError, FileNotFoundError) as exc:
        parser.error(str(exc))
    grid = configurations(policies, budgets)
    started = datetime.now(timezone.utc).isoformat(timespec="seconds")
    commit = git_commit()
    print(f"{len(items)} items, {len(grid)} configuration(s): {', '.join(f'{p}@{b:g}' for p, b in grid)}")
    configs: list[ConfigResult] = []
    error: str | None = None
    if args.url is not None:
        configs.append(run_config(args.url.rstrip("/"), *grid[0], items, args))
    else:
        log_dir = Path(args.log_dir or tempfile.mkdtemp(prefix="bench_bfcl_logs_"))
        for policy, budget in grid:
            server_args = server_flags(args.server_args, policy, budget, args.radix_cache, args.pask_policy)
            log_path = log_dir / f"server_{policy}_{budget:g}.log"
            server = ServerProcess(server_args, log_path, port=args.port)
            print(f"starting server {policy}@{budget:g} on {server.url}, log {log_path}")
            try:
                server.wait_ready(timeout_s=args.server_timeout)
                config = run_config(server.url, policy, budget, items, args)
            except (ServerStartError, requests.RequestException) as exc:
                error = _config_failure(policy, budget, exc, server)
                break
            finally:
                server.stop()
            config.server.update(
                command=shlex.join(["python", "-m", "sglang_pask.launch_server", *server_args]), log=str(log_path)
            )
            configs.append(config)
    record = {
        "command": shlex.join(["python", "-m", "bench.bfcl", *(sys.argv[1:] if argv is None else argv)]),
        "date": started,
        "machine": machine_info(),
        "commit": commit,
        "categories": args.categories,
        "split": args.split,
        "ids_file": args.ids,
        "limit": args.limit,
        "api": args.api,
        "grammar": args.grammar,
        "max_tokens": args.max_tokens,
        "concurrency": args.concurrency,
        # None: asked a running server (--url), whose cache setting the bench does not know.
        "radix_cache": None
        if args.url is not None
        else (args.radix_cache and "--disable-radix-cache" not in shlex.split(args.server_args)),
        "n_items": len(items),
        "complete": error is None,
        **({} if error is None else {"error": error}),
        "configs": [config_entry(c) for c in configs],
    }
    if args.json:
        Path(args.json).write_text(json.dumps(record, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    if configs:
        _render(record, configs, args)
    return run_exit_status(
        error,
        f"the {len(configs)} configuration(s) finished before it are in the table above "
        "(and in --json / --markdown / --plot; the JSON says complete: false)"
        if configs
        else None,
    )


def _config_failure(policy: str, budget: float, exc: Exception, server: ServerProcess) -> str:
    """What to tell the user when a configuration's server did not start or stopped answering."""
    if isinstance(exc, ServerStartError):
        return f"the {policy}@{budget:g} server did not start: {exc}"
    return (
        f"the {policy}@{budget:g} run failed ({type(exc).__name__}: {exc}); the server's log ended:\n"
        f"{server.log_tail(10)}"
    )


if __name__ == "__main__":
    exit_on_sigterm()
    sys.exit(main())
