"""Soak test: minutes of mixed concurrent load against a server, counting what went wrong.

For each configuration (``--configs``) this starts ``python -m sglang_pask.launch_server`` (or uses the
server at ``--url``) and runs ``--minutes`` of load from ``--concurrency`` workers. The kinds of
request are drawn with ``--seed``: first each kind once, in a shuffled order (so even a short run
sends every kind), then shuffled rounds in which each kind appears as often as its weight:

* ``plain``, ``regex``, ``json_schema``: ``/generate``, unconstrained or constrained; every constrained
  answer is validated (``re.fullmatch``, JSON Schema);
* ``tool_strict``, ``tool_nonstrict``: ``/v1/chat/completions`` with ``tools`` and ``tool_choice:
  "required"``, the tools marked ``strict: true`` or not; every call's arguments are validated against
  its tool's ``parameters``. Without ``--strict-tools`` SGLang constrains a non-strict tool's
  arguments only to "any JSON object", so violations there are expected: reported, never a failure;
* ``stream_generate`` (regex-constrained, its final text validated), ``stream_chat``: streamed
  answers, which must end with a finish reason and ``data: [DONE]``;
* ``n2`` (``n=2``, both samples validated), ``logprobs`` (``return_logprob``, counts checked),
  ``kv_roles`` (``json_schema`` with ``return_kv_roles``: one role per token);
* ``long_prompt``: token ids up to near the context length (``/tokenize``'s ``max_model_len``);
* ``disconnect`` (the client closes a stream after its first chunks), ``abort`` (``/abort_request``
  with the request's rid, streamed or not);
* malformed bodies, each of which must get a 4xx: ``bad_json`` (invalid JSON), ``bad_type`` (wrong
  types), ``bad_batch`` (fewer ``sampling_params`` than texts), ``bad_regex`` (uncompilable),
  ``bad_input_id`` (outside the vocabulary), ``empty_text``.

A constrained answer that stopped at its token limit is counted as truncated, not validated (the
grammars here are bounded well below the limit; a random model's non-strict tool arguments are not).

Before the load and after it (once no request holds KV, after ``POST /flush_cache``) it reads the
KV pool (``/server_info`` -> ``internal_states[0].sglang_pask.kv_pool``). ``/health`` is polled
during the load and checked after it, with ``/health_generate`` (one generated token); a server this
bench started must not exit, and a server must not restart (its scheduler pid and start time from
``/server_info`` stay the same). The server log is searched for SGLang's idle memory-leak warnings.

A configuration **fails** on: any 5xx; a constraint violation (except ``tool_nonstrict``); a 2xx
response of the wrong shape; a malformed request not answered 4xx or a valid one refused; a hang
(no answer within ``--request-timeout``) or a connection error; slots or tokens in use after the
flush; a crash, a restart, or ``/health`` failing after the load; a memory-leak warning in the log.
The exit status is 1 if any configuration failed, 2 on a usage error, else 0.

Prints a table per configuration (requests by kind and status, p50/p99 latency, validated answers,
violations, truncated answers) and a summary across configurations; ``--json`` writes everything
(with each problem's request and response), ``--markdown`` a results page with the command, date,
machine and commit.

Example::

    python -m bench.soak --minutes 10 --json soak.json --markdown soak.md
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Optional, Sequence

import requests
from tqdm import tqdm

from bench.common import (
    exit_on_sigterm,
    markdown_header,
    positive_int,
    refuse_flags_given,
    run_exit_status,
    run_header,
)
from bench.soak_load import (
    CONSTRAINED_KINDS,
    EXPECTED_VIOLATION_KINDS,
    FILLER,
    KINDS,
    LONG_PROMPT_NEW_TOKENS,
    MALFORMED_KINDS,
    PATH_NOTE,
    LoadContext,
    Outcome,
    run_request,
    schedule,
)
from sglang_pask.cli_paths import output_file
from sglang_pask.server_process import ServerProcess, ServerStartError

# The configurations: no flags; dropping at a third of the KV in 4 groups; the README's
# recommended function-call configuration; StructKV on every prompt with the README's recommended
# one group per layer of the default model (24 layers).
CONFIGS: dict[str, list[str]] = {
    "full": [],
    "drop033": ["--kv-policy", "snapkv", "--kv-budget", "0.33", "--kv-layer-groups", "4"],
    "pask-lowbit": [
        *("--kv-policy", "pask", "--kv-budget", "0.02", "--kv-layer-groups", "4"),
        *("--kv-dropped", "k4v2", "--kv-decode", "lowbit"),
    ],
    "structkv": ["--structkv", "--structkv-min-prompt", "0", "--kv-layer-groups", "24"],
}
# Log lines of SGLang's idle leak check (the scheduler raises on a leak by default, so the server
# also exits: reported as a crash as well).
LEAK_MARKERS = ("memory leak detected", "Mem Leak Detected")
IDLE_WAIT_S = 120.0
FLUSH_TRIES = 5


@dataclass
class PoolReading:
    """The KV pool's usage at one moment (``/server_info`` -> ``sglang_pask.kv_pool``)."""

    tokens_in_use: int
    bytes_in_use: int
    slots_in_use: list[int]
    lowbit_slots_in_use: list[int]
    running_requests: int

    @classmethod
    def of(cls, server_info: dict) -> Optional["PoolReading"]:
        """The reading in a ``/server_info`` answer; None on a server without sglang-pask's pool."""
        pool = ((server_info.get("internal_states") or [{}])[0].get("sglang_pask") or {}).get("kv_pool")
        if not pool:
            return None
        return cls(
            tokens_in_use=pool["tokens_in_use"],
            bytes_in_use=pool["bytes_in_use"],
            slots_in_use=[g["slots_in_use"] for g in pool["groups"]],
            lowbit_slots_in_use=[g.get("lowbit_slots_in_use", 0) for g in pool["groups"]],
            running_requests=pool["running_requests"],
        )

    @property
    def empty(self) -> bool:
        return self.tokens_in_use == 0 and self.bytes_in_use == 0 and not any(self.slots_in_use)


@dataclass
class KindSummary:
    """One kind's requests in one configuration."""

    kind: str
    sent: int
    statuses: dict[str, int]
    p50_ms: Optional[float]
    p99_ms: Optional[float]
    checked: int
    violations: int
    truncated: int
    bad_responses: int
    wrong_statuses: int
    hangs: int


@dataclass
class ConfigRun:
    """What one configuration's soak found."""

    name: str
    flags: list[str]
    url: Optional[str] = None
    error: Optional[str] = None
    kinds_asked: list[str] = field(default_factory=list)
    load_s: float = 0.0
    outcomes: list[Outcome] = field(default_factory=list)
    context_len: Optional[int] = None
    long_prompt_tokens: Optional[int] = None
    tool_parser: Optional[str] = None
    pool_before: Optional[PoolReading] = None
    pool_after_load: Optional[PoolReading] = None
    pool_after_flush: Optional[PoolReading] = None
    flush: Optional[str] = None
    health_checks: int = 0
    health_failures: int = 0
    health_after: Optional[str] = None
    exit_code: Optional[int] = None
    restarted: Optional[str] = None
    leak_warnings: int = 0
    log_tail: Optional[str] = None


def percentile(values: Sequence[float], q: float) -> Optional[float]:
    """The ``q``-th percentile (0-100) of ``values`` by nearest rank; None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, -(-len(ordered) * q // 100))
    return ordered[int(rank) - 1]


def status_label(outcome: Outcome) -> str:
    if outcome.status is not None:
        return str(outcome.status)
    return "timeout" if outcome.hang else "no response"


def summarize(outcomes: Sequence[Outcome]) -> list[KindSummary]:
    """Per kind (in :data:`KINDS` order, kinds not sent left out): counts, statuses, latencies."""
    rows = []
    for kind in KINDS:
        mine = [o for o in outcomes if o.kind == kind]
        if not mine:
            continue
        latencies = [o.latency_s * 1e3 for o in mine if o.status is not None]
        rows.append(
            KindSummary(
                kind=kind,
                sent=len(mine),
                statuses=dict(sorted(Counter(status_label(o) for o in mine).items())),
                p50_ms=percentile(latencies, 50),
                p99_ms=percentile(latencies, 99),
                checked=sum(o.checked for o in mine),
                violations=sum(o.violation is not None for o in mine),
                truncated=sum(o.truncated for o in mine),
                bad_responses=sum(o.bad_response is not None for o in mine),
                wrong_statuses=sum(o.wrong_status is not None for o in mine),
                hangs=sum(o.hang for o in mine),
            )
        )
    return rows


def failures(run: ConfigRun) -> list[str]:
    """Why ``run`` failed, one sentence per reason; empty when it passed."""
    if run.error is not None:
        return [run.error.splitlines()[0]]
    found = []
    out = run.outcomes

    def count(what: str, n: int) -> None:
        if n:
            found.append(f"{n} {what}")

    count("responses with a 5xx status", sum((o.status or 0) >= 500 for o in out))
    count(
        "constraint violations (strict tools, regex, JSON Schema)",
        sum(o.violation is not None and o.kind not in EXPECTED_VIOLATION_KINDS for o in out),
    )
    count("2xx responses of the wrong shape", sum(o.bad_response is not None for o in out))
    count("wrong statuses (malformed not 4xx, valid refused)", sum(o.wrong_status is not None for o in out))
    count("hangs (no answer within the client timeout)", sum(o.hang for o in out))
    count("connection errors", sum(o.client_error is not None for o in out))
    if run.exit_code is not None:
        found.append(f"the server exited with status {run.exit_code}")
    if run.restarted:
        found.append(f"the server restarted ({run.restarted})")
    if run.health_after is not None:
        found.append(f"after the load: {run.health_after}")
    after = run.pool_after_flush
    if after is None:
        found.append("the pool could not be read after the flush")
    elif not after.empty:
        found.append(
            f"after the flush {after.tokens_in_use} tokens, slots {after.slots_in_use}, "
            f"{after.bytes_in_use} bytes still in use"
        )
    if run.flush is not None and not run.flush.startswith("flushed"):
        found.append(f"flush: {run.flush}")
    count("memory-leak warnings in the server log", run.leak_warnings)
    return found


# ---------------------------------------------------------------------------------------------------
# Tables and pages


def _ms(value: Optional[float]) -> str:
    return "-" if value is None else f"{value:.0f}"


def format_kind_table(run: ConfigRun) -> str:
    """Requests of one configuration by kind: statuses, p50/p99 latency (ms, answered requests),
    validated answers, violations, truncated answers, wrong-shape responses, wrong statuses, hangs."""
    lines = [
        "| kind | sent | statuses | p50 ms | p99 ms | validated | violations | truncated | bad shape | "
        "wrong status | hangs |",
        "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for s in summarize(run.outcomes):
        statuses = " ".join(f"{k}:{v}" for k, v in s.statuses.items())
        constrained = s.kind in CONSTRAINED_KINDS
        lines.append(
            f"| {s.kind} | {s.sent} | {statuses} | {_ms(s.p50_ms)} | {_ms(s.p99_ms)} | "
            f"{s.checked if constrained else '-'} | {s.violations if constrained else '-'} | "
            f"{s.truncated if constrained else '-'} | {s.bad_responses} | {s.wrong_statuses} | {s.hangs} |"
        )
    return "\n".join(lines)


def _pool_cell(reading: Optional[PoolReading]) -> str:
    """Tokens, slots per layer group (up to 4 groups one by one, more as their range) and bytes."""
    if reading is None:
        return "-"
    slots = reading.slots_in_use
    if len(slots) <= 4:
        per_group = "/".join(map(str, slots))
    elif min(slots) == max(slots):
        per_group = f"{slots[0]} in each of {len(slots)} groups"
    else:
        per_group = f"{min(slots)}-{max(slots)} in {len(slots)} groups"
    return f"{reading.tokens_in_use} tok, slots {per_group}, {reading.bytes_in_use} B"


def format_summary_table(runs: Sequence[ConfigRun]) -> str:
    """One row per configuration: requests, kinds sent of those asked for, 5xx, violations (strict tools and other constrained
    answers; non-strict tools apart), hangs, health, crashes, the pool before the load and after the
    flush, and the verdict."""
    lines = [
        "| config | requests | kinds sent | 5xx | violations | non-strict tool violations | hangs | health failures "
        "(during / after) | crashes / restarts | pool before | pool after load | pool after flush | verdict |",
        "|---|---:|---:|---:|---:|---:|---:|---|---|---|---|---|---|",
    ]
    for run in runs:
        out = run.outcomes
        strict = sum(o.violation is not None and o.kind not in EXPECTED_VIOLATION_KINDS for o in out)
        loose = sum(o.violation is not None and o.kind in EXPECTED_VIOLATION_KINDS for o in out)
        loose_checked = sum(o.checked for o in out if o.kind in EXPECTED_VIOLATION_KINDS)
        crash = "exited" if run.exit_code is not None else "0"
        reasons = failures(run)
        lines.append(
            f"| {run.name} | {len(out)} | {len({o.kind for o in out})} of {len(run.kinds_asked)} | "
            f"{sum((o.status or 0) >= 500 for o in out)} | {strict} | "
            f"{loose} of {loose_checked} | {sum(o.hang for o in out)} | {run.health_failures} of "
            f"{run.health_checks} / {'ok' if run.health_after is None else 'FAILED'} | "
            f"{crash} / {'yes' if run.restarted else '0'} | {_pool_cell(run.pool_before)} | "
            f"{_pool_cell(run.pool_after_load)} | {_pool_cell(run.pool_after_flush)} | "
            f"{'pass' if not reasons else 'FAIL: ' + '; '.join(reasons)} |"
        )
    return "\n".join(lines)


def problem_lines(run: ConfigRun, limit: int = 8) -> list[str]:
    """Markdown list of up to ``limit`` problem requests per kind of problem, with their excerpts."""
    lines = []
    shown: Counter = Counter()
    for o in run.outcomes:
        what = (
            ("5xx" if (o.status or 0) >= 500 else None)
            or (o.violation and ("expected violation" if o.kind in EXPECTED_VIOLATION_KINDS else "violation"))
            or (o.bad_response and "bad shape")
            or (o.wrong_status and "wrong status")
            or ("hang" if o.hang else None)
            or (o.client_error and "connection error")
        )
        if what is None or shown[(what, o.kind)] >= limit:
            continue
        shown[(what, o.kind)] += 1
        detail = o.violation or o.bad_response or o.wrong_status or o.client_error or ""
        lines.append(f"- {what}, `{o.kind}`, status {status_label(o)}: {detail}")
        if o.request:
            lines.append(f"  - request: `{o.request}`")
        if o.response:
            lines.append(f"  - response: `{o.response}`")
    return lines


def format_report(runs: Sequence[ConfigRun]) -> str:
    """The text printed at the end: the summary, then each configuration's kinds."""
    parts = [format_summary_table(runs)]
    for run in runs:
        parts.append(f"{run.name} ({' '.join(run.flags) or 'no flags'}):\n\n{format_kind_table(run)}")
    return "\n\n".join(parts)


def markdown_page(record: dict, runs: Sequence[ConfigRun], note: Optional[str]) -> str:
    """The ``--markdown`` page: header, settings, the summary, each configuration's kinds and
    problems."""
    settings = record["settings"]
    lines = [
        markdown_header("Soak test: mixed concurrent load", record).rstrip("\n"),
        f"- load: {settings['minutes']:g} min per configuration, concurrency {settings['concurrency']}, "
        f"seed {settings['seed']}, client timeout {settings['request_timeout']:g} s",
        f"- server flags for every configuration: `{settings['server_args'] or '(none)'}`",
        "",
    ]
    if note:
        lines += [note, ""]
    lines += [
        "A configuration fails on a 5xx, a constraint violation (non-strict tools apart: SGLang constrains "
        "their arguments only to any JSON object), a response of the wrong shape, a malformed request not "
        "answered 4xx, a hang, KV still in use after the flush, a crash, a restart or a leak warning.",
        "",
        format_summary_table(runs),
        "",
    ]
    for run in runs:
        lines += [
            f"## {run.name}",
            "",
            f"- flags: `{' '.join(run.flags) or '(none)'}`",
            f"- context length {run.context_len}, long prompts {run.long_prompt_tokens} tokens, "
            f"tool-call parser {run.tool_parser or 'none'}, load {run.load_s:.0f} s",
        ]
        if run.error:
            lines += [f"- **not soaked**: `{run.error.splitlines()[0]}`"]
        unsent = [kind for kind in run.kinds_asked if kind not in {o.kind for o in run.outcomes}]
        if unsent and not run.error:
            lines += [f"- kinds not sent in the time: {', '.join(unsent)}"]
        malformed = [o for o in run.outcomes if o.kind in MALFORMED_KINDS]
        if malformed:
            paths = sum(o.note == PATH_NOTE for o in malformed)
            lines += [
                f"- 4xx error bodies that name a source file path: {paths} of {len(malformed)} malformed requests"
            ]
        lines += ["", format_kind_table(run), ""]
        problems = problem_lines(run)
        if problems:
            lines += ["Problems (at most 8 of each kind shown):", "", *problems, ""]
        if run.log_tail:
            lines += ["Server log, last lines:", "", "```", run.log_tail, "```", ""]
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------------
# Running


class HealthMonitor(threading.Thread):
    """Polls ``/health`` every ``interval_s`` while the load runs; with ``server`` (a process this
    bench started) also notices its exit and sets ``gone``, which ends the load early."""

    def __init__(self, url: str, interval_s: float, server: Optional[ServerProcess]) -> None:
        super().__init__(daemon=True)
        self.url, self.interval_s, self.server = url, interval_s, server
        self.checks = self.failures = 0
        self.stop = threading.Event()
        self.gone = threading.Event()

    def run(self) -> None:
        while not self.stop.wait(self.interval_s):
            if self.server is not None and self.server.process.poll() is not None:
                self.gone.set()
                return
            self.checks += 1
            try:
                ok = requests.get(f"{self.url}/health", timeout=30).status_code == 200
            except requests.RequestException:
                ok = False
            self.failures += not ok


def _get(url: str, path: str, timeout: float = 60) -> dict:
    response = requests.get(url + path, timeout=timeout)
    response.raise_for_status()
    return response.json()


def server_identity(server_info: dict) -> tuple[Any, Any]:
    """(scheduler pid, start time) of a ``/server_info`` answer: they change when a server restarts."""
    state = (server_info.get("internal_states") or [{}])[0]
    return (state.get("sglang_pask") or {}).get("pid"), state.get("startup_time")


def load_context(url: str, args: argparse.Namespace) -> tuple[LoadContext, dict]:
    """What the load needs from the server (context length, filler token ids, tool-call parser,
    streaming mode), and the ``/server_info`` read before the load."""
    model_info = _get(url, "/model_info")
    server_info = _get(url, "/server_info")
    tokens = requests.post(url + "/tokenize", json={"prompt": FILLER}, timeout=60)
    tokens.raise_for_status()
    tokens = tokens.json()
    context_len = int(tokens["max_model_len"])
    longest = context_len - LONG_PROMPT_NEW_TOKENS - 16
    if server_info.get("max_req_input_len"):
        longest = min(longest, int(server_info["max_req_input_len"]) - LONG_PROMPT_NEW_TOKENS - 16)
    ctx = LoadContext(
        url=url,
        timeout_s=args.request_timeout,
        context_len=context_len,
        long_prompt_tokens=args.long_prompt_tokens or longest,
        filler_ids=list(tokens["tokens"]),
        tool_parser=model_info.get("tool_call_parser"),
        incremental_stream=bool(server_info.get("incremental_streaming_output")),
    )
    return ctx, server_info


def run_load(
    ctx: LoadContext, args: argparse.Namespace, kinds: list[str], label: str, gone: threading.Event
) -> list[Outcome]:
    """``--minutes`` of load from ``--concurrency`` workers; each finishes its request in flight at
    the end (bounded by the client timeout). Stops early when ``gone`` is set."""
    order = schedule(kinds, args.seed)
    lock = threading.Lock()
    outcomes: list[Outcome] = []
    duration = args.minutes * 60
    deadline = time.monotonic() + duration

    def worker() -> None:
        with requests.Session() as session:
            while time.monotonic() < deadline and not gone.is_set():
                with lock:
                    index, kind = next(order)
                outcome = run_request(ctx, session, kind, args.seed, index)
                with lock:
                    outcomes.append(outcome)

    threads = [threading.Thread(target=worker, daemon=True) for _ in range(args.concurrency)]
    start = time.monotonic()
    for thread in threads:
        thread.start()
    with tqdm(total=round(duration), desc=f"soak {label}", unit="s", file=sys.stderr, disable=args.quiet) as bar:
        while any(thread.is_alive() for thread in threads):
            time.sleep(1.0)
            bar.n = min(round(time.monotonic() - start), bar.total)
            with lock:
                bar.set_postfix(
                    requests=len(outcomes),
                    problems=sum(o.problem and o.kind not in EXPECTED_VIOLATION_KINDS for o in outcomes),
                    refresh=False,
                )
            bar.refresh()
    return outcomes


def settle_and_flush(url: str, run: ConfigRun) -> None:
    """Wait until no request holds KV, read the pool, flush the cache (retrying while the server
    says it is busy) and read the pool again."""
    deadline = time.monotonic() + IDLE_WAIT_S
    while True:
        run.pool_after_load = PoolReading.of(_get(url, "/server_info"))
        if run.pool_after_load is None or run.pool_after_load.running_requests == 0:
            break
        if time.monotonic() > deadline:
            run.flush = (
                f"{run.pool_after_load.running_requests} requests still held KV {IDLE_WAIT_S:.0f} s after the load"
            )
            break
        time.sleep(1.0)
    message = ""
    for _ in range(FLUSH_TRIES):
        response = requests.post(url + "/flush_cache", params={"timeout": 30}, timeout=90)
        message = response.text.strip().splitlines()[0] if response.text.strip() else str(response.status_code)
        run.pool_after_flush = PoolReading.of(_get(url, "/server_info"))
        if response.status_code == 200 and (run.pool_after_flush is None or run.pool_after_flush.empty):
            if run.flush is None:
                run.flush = f"flushed ({message})"
            return
        time.sleep(2.0)
    run.flush = run.flush or f"not flushed after {FLUSH_TRIES} tries: {message}"


def check_after(url: str, run: ConfigRun, identity: tuple[Any, Any], server: Optional[ServerProcess]) -> None:
    """``/health`` and ``/health_generate`` after the load, the server's identity, its process."""
    problems = []
    for path in ("/health", "/health_generate"):
        try:
            status = requests.get(url + path, timeout=60).status_code
        except requests.RequestException as exc:
            status = type(exc).__name__
        if status != 200:
            problems.append(f"{path} answered {status}")
    try:
        now = server_identity(_get(url, "/server_info"))
        if now != identity:
            run.restarted = f"scheduler pid and start time {identity} before, {now} after"
    except requests.RequestException as exc:
        problems.append(f"/server_info failed: {type(exc).__name__}")
    run.health_after = "; ".join(problems) or None
    if server is not None and server.process.poll() is not None:
        run.exit_code = server.process.returncode


def soak_server(
    url: str, run: ConfigRun, args: argparse.Namespace, kinds: list[str], server: Optional[ServerProcess]
) -> None:
    """The whole soak of one running server, into ``run``."""
    ctx, info = load_context(url, args)
    run.context_len, run.long_prompt_tokens, run.tool_parser = ctx.context_len, ctx.long_prompt_tokens, ctx.tool_parser
    run.pool_before = PoolReading.of(info)
    identity = server_identity(info)
    monitor = HealthMonitor(url, args.health_interval, server)
    monitor.start()
    start = time.monotonic()
    try:
        run.outcomes = run_load(ctx, args, kinds, run.name, monitor.gone)
    finally:
        run.load_s = time.monotonic() - start
        monitor.stop.set()
        monitor.join()
        run.health_checks, run.health_failures = monitor.checks, monitor.failures
    if server is not None and server.process.poll() is not None:
        run.exit_code = server.process.returncode
        return
    try:
        settle_and_flush(url, run)
        check_after(url, run, identity, server)
    except requests.RequestException as exc:
        run.health_after = f"server unreachable after the load: {type(exc).__name__}: {str(exc)[:200]}"
        if server is not None and server.process.poll() is not None:
            run.exit_code = server.process.returncode


def run_config(name: str, flags: list[str], args: argparse.Namespace, kinds: list[str], log_dir: Path) -> ConfigRun:
    """Start a server with ``flags`` (plus ``--server-args``), soak it, stop it."""
    all_flags = [*flags, *shlex.split(args.server_args)]
    run = ConfigRun(name=name, flags=all_flags, kinds_asked=list(kinds))
    log_path = log_dir / f"{name}.log"
    server = ServerProcess(all_flags, log_path)
    try:
        server.wait_ready(timeout_s=args.start_timeout)
        run.url = server.url
        soak_server(server.url, run, args, kinds, server)
    except ServerStartError as exc:
        run.error = f"server did not start: {exc}"
    except (requests.RequestException, KeyError, ValueError) as exc:  # the server's info could not be read
        run.error = f"could not soak the server: {type(exc).__name__}: {str(exc)[:300]}"
    finally:
        if run.exit_code is None and server.process.poll() is not None:
            run.exit_code = server.process.returncode
        server.stop()
        log = log_path.read_text(errors="replace") if log_path.exists() else ""
        run.leak_warnings = sum(marker in line for line in log.splitlines() for marker in LEAK_MARKERS)
        if run.error or run.exit_code is not None or run.health_after or run.leak_warnings:
            run.log_tail = server.log_tail(40)
    return run


def parse_config(text: str) -> tuple[str, list[str]]:
    """``argparse`` type of a ``--configs`` entry: a name of :data:`CONFIGS`, or ``NAME=FLAGS``."""
    if text in CONFIGS:
        return text, list(CONFIGS[text])
    name, sep, flags = text.partition("=")
    if sep and name and " " not in name:
        return name, shlex.split(flags)
    raise argparse.ArgumentTypeError(f"{text!r} is neither one of {', '.join(CONFIGS)} nor NAME=FLAGS")


def build_parser() -> argparse.ArgumentParser:
    config_help = "; ".join(f"{name}: {' '.join(flags) or 'no flags'}" for name, flags in CONFIGS.items())
    parser = argparse.ArgumentParser(
        prog="python -m bench.soak",
        description=__doc__.split("\n\n")[0],
        epilog=__doc__.split("\n\n", 1)[1].rsplit("\n\nExample::", 1)[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--minutes", type=float, default=10.0, help="load per configuration, in minutes (default: 10)")
    parser.add_argument("--concurrency", type=positive_int, default=4, help="concurrent client workers (default: 4)")
    parser.add_argument(
        "--seed", type=int, default=0, help="seed of the kinds' order and of every request body (default: 0)"
    )
    parser.add_argument(
        "--configs",
        nargs="+",
        type=parse_config,
        default=[(name, list(flags)) for name, flags in CONFIGS.items()],
        metavar="CONFIG",
        help=f"server configurations, each started in turn (default: all four): {config_help}; or "
        "NAME=FLAGS for any other, e.g. 'drop05=--kv-policy snapkv --kv-budget 0.5'. The structkv and "
        "4-group configurations fit the default model's 24 layers; give others for another model",
    )
    parser.add_argument(
        "--server-args",
        default="",
        help="extra server flags for every configuration, one quoted string (e.g. '--model-path DIR'; a single "
        "flag as --server-args=--flag); "
        "with no --model-path the launcher serves the embedded default model with --tool-call-parser qwen25",
    )
    parser.add_argument(
        "--url",
        default=None,
        help="soak the server already running here instead of starting one per configuration (it must not "
        "serve other clients: the bench flushes its cache); --configs and --server-args are then refused",
    )
    parser.add_argument(
        "--kinds",
        nargs="+",
        choices=list(KINDS),
        default=list(KINDS),
        metavar="KIND",
        help="kinds of request to send (default: all), with their weights in each round after the first: "
        + ", ".join(f"{kind} {weight}" for kind, (_, weight) in KINDS.items()),
    )
    parser.add_argument(
        "--request-timeout",
        type=float,
        default=300.0,
        help="client timeout of every request in seconds; a request over it counts as a hang (default: 300)",
    )
    parser.add_argument(
        "--long-prompt-tokens",
        type=positive_int,
        default=None,
        help="prompt length of the long_prompt kind (default: the context length minus its 8-token answer "
        "and a 16-token margin, capped by the server's max_req_input_len)",
    )
    parser.add_argument(
        "--health-interval", type=float, default=5.0, help="seconds between /health polls during the load (default: 5)"
    )
    parser.add_argument(
        "--start-timeout", type=float, default=900.0, help="seconds a server may take to start (default: 900)"
    )
    parser.add_argument("--json", type=output_file, default=None, help="write the results and run details here")
    parser.add_argument("--markdown", type=output_file, default=None, help="write a results page here")
    parser.add_argument("--note", default=None, help="a paragraph put at the top of the --markdown page")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.minutes <= 0:
        parser.error("--minutes must be > 0")
    if args.url is not None:
        refuse_flags_given(parser, args, ["configs", "server_args"], "--url soaks a running server, none is started")
    names = [name for name, _ in args.configs]
    if len(set(names)) != len(names):
        parser.error(f"--configs: a name given twice ({', '.join(names)})")
    runs: list[ConfigRun] = []
    error = None
    if args.url is not None:
        run = ConfigRun(name="url", flags=[], url=args.url.rstrip("/"), kinds_asked=list(args.kinds))
        try:
            soak_server(run.url, run, args, args.kinds, None)
        except (requests.RequestException, KeyError, ValueError) as exc:
            run.error = f"could not soak {args.url}: {type(exc).__name__}: {str(exc)[:300]}"
        runs.append(run)
    else:
        with tempfile.TemporaryDirectory(prefix="bench-soak-") as log_dir:
            for name, flags in args.configs:
                runs.append(run_config(name, flags, args, args.kinds, Path(log_dir)))
                print(format_summary_table(runs), file=sys.stderr)
    report = format_report(runs)
    print(report)
    failed = [run.name for run in runs if failures(run)]
    if failed:
        error = f"failed: {', '.join(failed)} (see the table)"
    record = {
        **run_header("python -m bench.soak", argv),
        "settings": {
            "minutes": args.minutes,
            "concurrency": args.concurrency,
            "seed": args.seed,
            "request_timeout": args.request_timeout,
            "server_args": args.server_args,
            "kinds": args.kinds,
            "url": args.url,
        },
        "configs": [
            {
                **{k: v for k, v in asdict(run).items() if k != "outcomes"},
                "kinds": [asdict(s) for s in summarize(run.outcomes)],
                "failures": failures(run),
                "problems": [asdict(o) for o in run.outcomes if o.problem or o.violation],
                "requests": [[o.kind, o.status, round(o.latency_s * 1e3, 1), o.note] for o in run.outcomes],
            }
            for run in runs
        ],
        "passed": error is None,
        "table": report,
    }
    if args.json:
        Path(args.json).write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    if args.markdown:
        Path(args.markdown).write_text(markdown_page(record, runs, args.note), encoding="utf-8")
    return run_exit_status(error, None)


if __name__ == "__main__":
    exit_on_sigterm()
    raise SystemExit(main())
