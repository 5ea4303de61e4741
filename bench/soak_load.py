"""The load of ``python -m bench.soak``: the kinds of request, how each is sent, and how each answer is
checked.

Every kind is one function ``(LoadContext, requests.Session, random.Random) -> Outcome``: it builds
its body from the seeded ``rng``, sends it with the client timeout, and validates what came back
(a constrained answer against its regex, JSON Schema or tool schemas; a response's shape; a
malformed request's 4xx). Standard library, ``requests`` and ``jsonschema`` only; no sglang import.
"""

from __future__ import annotations

import json
import random
import re
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Optional

import jsonschema
import requests

# Prompts the load draws from; a few share long prefixes, so the radix cache matches across requests.
PROMPTS = (
    "Write a Python function that returns the n-th Fibonacci number.",
    "Explain what a hash map is in two sentences.",
    "List three differences between TCP and UDP.",
    "What is the capital of France? Answer briefly.",
    "Summarize the plot of a detective story in one paragraph.",
    "def parse_config(path):\n    ",
    "The weather in Paris today is",
    "SELECT name, age FROM users WHERE",
    "Translate to German: The cat sleeps on the sofa.",
    "Give a short name for a command-line tool that counts words.",
)
FILLER = (
    "The quick brown fox jumps over the lazy dog while the committee reviews the quarterly report, "
    "and the server logs every request it receives in a file that grows by the hour. "
)

# Constrained answers. Every grammar is bounded (fixed alternatives, character classes with an upper
# repeat count, integer ranges), so an answer cannot outgrow CONSTRAINED_NEW_TOKENS; strings in the
# schemas use ``pattern`` rather than ``maxLength``, whose xgrammar rule admits raw control
# characters that JSON does not.
REGEXES = (
    r'\[get_weather\(city="[A-Za-z ]{1,20}"\)\]',
    r"\d{4}-\d{2}-\d{2}",
    r"(yes|no|maybe), because [a-z ]{1,30}\.",
    r"[A-Z][a-z]{1,10}( [a-z]{1,10}){0,4}",
)
SCHEMAS = (
    {
        "type": "object",
        "properties": {
            "name": {"type": "string", "pattern": "^[A-Za-z ]{1,20}$"},
            "age": {"type": "integer", "minimum": 0, "maximum": 120},
            "member": {"type": "boolean"},
        },
        "required": ["name", "age", "member"],
        "additionalProperties": False,
    },
    {
        "type": "object",
        "properties": {
            "status": {"type": "string", "enum": ["ok", "error", "pending"]},
            "count": {"type": "integer", "minimum": 0, "maximum": 1000},
            "tags": {"type": "array", "items": {"type": "string", "enum": ["a", "b", "c"]}, "maxItems": 3},
        },
        "required": ["status", "count", "tags"],
        "additionalProperties": False,
    },
)
TOOLS = (
    {
        "name": "get_weather",
        "description": "Current weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "pattern": "^[A-Za-z ]{1,20}$"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city"],
            "additionalProperties": False,
        },
    },
    {
        "name": "search_files",
        "description": "Find files whose name matches a pattern.",
        "parameters": {
            "type": "object",
            "properties": {
                "pattern": {"type": "string", "pattern": "^[A-Za-z0-9_.*]{1,16}$"},
                "max_results": {"type": "integer", "minimum": 1, "maximum": 50},
            },
            "required": ["pattern", "max_results"],
            "additionalProperties": False,
        },
    },
    {
        "name": "set_alarm",
        "description": "Set an alarm clock.",
        "parameters": {
            "type": "object",
            "properties": {
                "hour": {"type": "integer", "minimum": 0, "maximum": 23},
                "minute": {"type": "integer", "minimum": 0, "maximum": 59},
            },
            "required": ["hour", "minute"],
            "additionalProperties": False,
        },
    },
)
TOOL_QUESTIONS = (
    "What is the weather in Paris in celsius?",
    "Find up to 10 Python files in the project.",
    "Wake me up at 7:30 tomorrow.",
    "Is it raining in Oslo?",
)

CONSTRAINED_NEW_TOKENS = 160
LONG_PROMPT_NEW_TOKENS = 8
# Requests that abort or disconnect ask for this many tokens with ignore_eos, so they are still
# running when the client leaves.
LONG_ANSWER_TOKENS = 512
EXCERPT_CHARS = 600
# The note on a malformed request's 4xx whose error body names a source file (a traceback leaking
# the server's paths).
PATH_NOTE = "error body names a source file path"


@dataclass
class LoadContext:
    """What every request of one run needs to know about the server.

    Attributes
    ----------
    url : str
        The server's base URL.
    timeout_s : float
        Client timeout of every request: a request still unanswered then counts as a hang.
    context_len : int
        The model's context length (``max_model_len`` of ``/tokenize``).
    long_prompt_tokens : int
        Prompt length of the ``long_prompt`` kind (at most ``context_len`` minus its answer).
    filler_ids : list of int
        Token ids of a filler sentence, repeated to build long prompts.
    tool_parser : str or None
        The server's tool-call parser (``/model_info``); None: SGLang answers ``tool_choice:
        "required"`` with a JSON array of ``{"name", "parameters"}`` as the message content.
    incremental_stream : bool
        Whether a streamed ``/generate`` chunk holds only the new text (else the text so far).
    """

    url: str
    timeout_s: float
    context_len: int
    long_prompt_tokens: int
    filler_ids: list[int]
    tool_parser: Optional[str] = None
    incremental_stream: bool = False


@dataclass
class Outcome:
    """One request of the load and what became of it.

    ``status`` is the HTTP status (None when no response came: ``hang`` when the client timeout
    passed, ``client_error`` otherwise). ``checked`` says a constrained answer was validated;
    ``violation`` is what broke its constraint; ``truncated`` marks a constrained answer that ended
    at its token limit, so was not validated; ``bad_response`` is a 2xx response of the wrong
    shape; ``wrong_status`` a status this kind must not get (a malformed request not answered 4xx,
    a valid one refused). ``request`` and ``response`` are excerpts, kept only for problems.
    """

    kind: str
    status: Optional[int]
    latency_s: float
    hang: bool = False
    client_error: Optional[str] = None
    checked: int = 0
    violation: Optional[str] = None
    truncated: int = 0
    bad_response: Optional[str] = None
    wrong_status: Optional[str] = None
    note: Optional[str] = None
    request: Optional[str] = None
    response: Optional[str] = None

    @property
    def problem(self) -> bool:
        return bool(
            self.hang
            or self.client_error
            or self.violation
            or self.bad_response
            or self.wrong_status
            or (self.status or 0) >= 500
        )


# ---------------------------------------------------------------------------------------------------
# Validators (pure)


def check_regex(pattern: str, text: str) -> Optional[str]:
    """None when ``text`` fully matches ``pattern`` (``re.fullmatch``), else what is wrong."""
    if re.fullmatch(pattern, text) is None:
        return f"{text[:120]!r} does not fully match the regex {pattern!r}"
    return None


def check_json_schema(schema: dict, text: str) -> Optional[str]:
    """None when ``text`` is JSON valid against ``schema``, else what is wrong."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        return f"not JSON ({exc.msg} at {exc.pos}): {text[:120]!r}"
    return _schema_error(schema, value)


def _schema_error(schema: dict, value: Any) -> Optional[str]:
    error = jsonschema.exceptions.best_match(jsonschema.Draft202012Validator(schema).iter_errors(value))
    if error is None:
        return None
    where = "/".join(str(p) for p in error.absolute_path) or "(root)"
    return f"{where}: {error.message}"


def tool_calls_of(message: dict) -> Optional[list[tuple[str, Any]]]:
    """The (name, arguments) of each tool call in a chat completion ``message``, arguments as sent
    (a JSON string from a tool-call parser, a value from the content); None when the message holds
    none: no ``tool_calls`` and a content that is not a JSON array of ``{"name", "parameters"}``
    (SGLang's answer to ``tool_choice: "required"`` on a server without a tool-call parser)."""
    calls = message.get("tool_calls")
    if calls:
        return [(call["function"]["name"], call["function"]["arguments"]) for call in calls]
    try:
        content = json.loads(message.get("content") or "")
    except json.JSONDecodeError:
        return None
    if isinstance(content, dict):
        content = [content]
    if not isinstance(content, list) or not content or not all(isinstance(c, dict) for c in content):
        return None
    return [(c.get("name"), c.get("parameters", {})) for c in content]


def check_tool_calls(tools: list[dict], message: dict) -> Optional[str]:
    """None when ``message`` calls at least one of ``tools`` (OpenAI ``function`` dicts) and every
    call's arguments are valid against that tool's ``parameters`` schema, else what is wrong."""
    calls = tool_calls_of(message)
    if not calls:
        return f"no tool call in the answer (content {str(message.get('content'))[:120]!r})"
    schemas = {tool["name"]: tool["parameters"] for tool in tools}
    for name, arguments in calls:
        if name not in schemas:
            return f"call of {name!r}, not an offered tool ({', '.join(schemas)})"
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments)
            except json.JSONDecodeError as exc:
                return f"{name}: arguments not JSON ({exc.msg}): {arguments[:120]!r}"
        error = _schema_error(schemas[name], arguments)
        if error is not None:
            return f"{name}: {error}"
    return None


def excerpt(value: Any, limit: int = EXCERPT_CHARS) -> str:
    """A short text of a request or response body: long id lists shortened, at most ``limit`` chars."""

    def shorten(v: Any) -> Any:
        if isinstance(v, dict):
            return {k: shorten(x) for k, x in v.items()}
        if isinstance(v, list):
            if len(v) > 16:
                return [*map(shorten, v[:4]), f"... {len(v)} items in all"]
            return [shorten(x) for x in v]
        if isinstance(v, str) and len(v) > 200:
            return v[:200] + f"... ({len(v)} chars)"
        return v

    text = value if isinstance(value, str) else json.dumps(shorten(value))
    return text if len(text) <= limit else text[:limit] + "..."


# ---------------------------------------------------------------------------------------------------
# Sending


@dataclass
class _Reply:
    status: Optional[int]
    latency_s: float
    body: Any = None
    text: str = ""
    hang: bool = False
    client_error: Optional[str] = None


def _post(
    ctx: LoadContext, session: requests.Session, path: str, body: Any = None, data: Optional[str] = None
) -> _Reply:
    start = time.perf_counter()
    try:
        response = session.post(
            ctx.url + path,
            json=body if data is None else None,
            data=data,
            headers={"content-type": "application/json"},
            timeout=(10, ctx.timeout_s),
        )
    except requests.Timeout:
        return _Reply(None, time.perf_counter() - start, hang=True)
    except requests.RequestException as exc:
        return _Reply(None, time.perf_counter() - start, client_error=type(exc).__name__ + ": " + str(exc)[:200])
    reply = _Reply(response.status_code, time.perf_counter() - start, text=response.text)
    try:
        reply.body = response.json()
    except ValueError:
        pass
    return reply


@dataclass
class _Stream:
    status: Optional[int]
    latency_s: float
    events: list = field(default_factory=list)
    done: bool = False
    hang: bool = False
    client_error: Optional[str] = None
    text: str = ""


def _stream(
    ctx: LoadContext,
    session: requests.Session,
    path: str,
    body: dict,
    stop_after: Optional[int] = None,
    on_first: Optional[Callable[[], None]] = None,
) -> _Stream:
    """POST ``body`` with ``stream`` and read its server-sent events until ``data: [DONE]``; with
    ``stop_after``, close the connection after that many events (a client that goes away);
    ``on_first`` runs once the first event arrived."""
    start = time.perf_counter()
    deadline = time.monotonic() + ctx.timeout_s
    result = _Stream(None, 0.0)
    try:
        with session.post(ctx.url + path, json=body, stream=True, timeout=(10, ctx.timeout_s)) as response:
            result.status = response.status_code
            if response.status_code != 200:
                result.text = response.text
                result.latency_s = time.perf_counter() - start
                return result
            for line in response.iter_lines():
                if time.monotonic() > deadline:
                    result.hang = True
                    break
                if not line.startswith(b"data:"):
                    continue
                payload = line[5:].strip()
                if payload == b"[DONE]":
                    result.done = True
                    break
                result.events.append(json.loads(payload))
                if len(result.events) == 1 and on_first is not None:
                    on_first()
                if stop_after is not None and len(result.events) >= stop_after:
                    break
    except (requests.RequestException, json.JSONDecodeError) as exc:
        # requests reports a read timeout inside a streamed body as a ConnectionError
        if isinstance(exc, requests.Timeout) or "Read timed out" in str(exc):
            result.hang = True
        else:
            result.client_error = type(exc).__name__ + ": " + str(exc)[:200]
    result.latency_s = time.perf_counter() - start
    return result


def _outcome(kind: str, reply: _Reply | _Stream, body: Any) -> Outcome:
    """The outcome of ``reply`` before any check: status, latency, a hang or client error, and a
    5xx kept with its request and response."""
    outcome = Outcome(kind, reply.status, reply.latency_s, hang=reply.hang, client_error=reply.client_error)
    if outcome.hang or outcome.client_error or (reply.status or 0) >= 500:
        _keep(outcome, body, reply.text)
    return outcome


def _keep(outcome: Outcome, body: Any, response: Any) -> Outcome:
    outcome.request = excerpt(body)
    outcome.response = excerpt(response)
    return outcome


def _expect_ok(outcome: Outcome, body: Any, reply: _Reply | _Stream) -> bool:
    """Whether a valid request got 200; a 4xx is recorded as a wrong status (5xx, hangs and client
    errors are already on the outcome)."""
    if outcome.status == 200:
        return True
    if outcome.status is not None and outcome.status < 500:
        outcome.wrong_status = f"valid request answered {outcome.status}"
        _keep(outcome, body, reply.text)
    return False


def _generate_body(rng: random.Random, max_new_tokens: int, **sampling: Any) -> dict:
    return {
        "text": rng.choice(PROMPTS),
        "sampling_params": {"max_new_tokens": max_new_tokens, "temperature": rng.choice([0.0, 0.7, 1.0]), **sampling},
    }


def _finished_by_length(meta: dict) -> bool:
    return (meta.get("finish_reason") or {}).get("type") == "length"


def _check_generated(outcome: Outcome, body: dict, result: dict, check: Callable[[str], Optional[str]]) -> None:
    """Validate one constrained ``/generate`` result (or count it truncated)."""
    if _finished_by_length(result["meta_info"]):
        outcome.truncated += 1
        outcome.note = f"stopped at the token limit, ending {result['text'][-80:]!r}"
        return
    outcome.checked += 1
    error = check(result["text"])
    if error is not None and outcome.violation is None:
        outcome.violation = error
        _keep(outcome, body, result)


# ---------------------------------------------------------------------------------------------------
# The kinds


def run_plain(ctx: LoadContext, session: requests.Session, rng: random.Random) -> Outcome:
    body = _generate_body(rng, rng.randint(8, 64))
    reply = _post(ctx, session, "/generate", body)
    outcome = _outcome("plain", reply, body)
    if _expect_ok(outcome, body, reply) and not isinstance((reply.body or {}).get("text"), str):
        outcome.bad_response = "no text in the response"
        _keep(outcome, body, reply.text)
    return outcome


def run_regex(ctx: LoadContext, session: requests.Session, rng: random.Random) -> Outcome:
    pattern = rng.choice(REGEXES)
    body = _generate_body(rng, CONSTRAINED_NEW_TOKENS, regex=pattern)
    reply = _post(ctx, session, "/generate", body)
    outcome = _outcome("regex", reply, body)
    if _expect_ok(outcome, body, reply):
        _check_generated(outcome, body, reply.body, lambda text: check_regex(pattern, text))
    return outcome


def run_json_schema(
    ctx: LoadContext, session: requests.Session, rng: random.Random, kind: str = "json_schema"
) -> Outcome:
    schema = rng.choice(SCHEMAS)
    sampling: dict[str, Any] = {"json_schema": json.dumps(schema)}
    if kind == "kv_roles":
        sampling["return_kv_roles"] = True
    body = _generate_body(rng, CONSTRAINED_NEW_TOKENS, **sampling)
    reply = _post(ctx, session, "/generate", body)
    outcome = _outcome(kind, reply, body)
    if not _expect_ok(outcome, body, reply):
        return outcome
    _check_generated(outcome, body, reply.body, lambda text: check_json_schema(schema, text))
    if kind == "kv_roles":
        meta = reply.body["meta_info"]
        roles, prompt_roles = meta.get("kv_roles"), meta.get("kv_prompt_roles")
        if roles is None or prompt_roles is None:
            outcome.bad_response = "return_kv_roles: no kv_roles / kv_prompt_roles in meta_info"
        elif len(roles) != meta["completion_tokens"] or len(prompt_roles) != meta["prompt_tokens"]:
            outcome.bad_response = (
                f"kv_roles {len(roles)} for {meta['completion_tokens']} output tokens, "
                f"kv_prompt_roles {len(prompt_roles)} for {meta['prompt_tokens']} prompt tokens"
            )
        if outcome.bad_response:
            _keep(outcome, body, reply.body)
    return outcome


def run_kv_roles(ctx: LoadContext, session: requests.Session, rng: random.Random) -> Outcome:
    return run_json_schema(ctx, session, rng, kind="kv_roles")


def _tool_body(rng: random.Random, strict: bool) -> tuple[dict, list[dict]]:
    offered = rng.sample(TOOLS, rng.randint(1, len(TOOLS)))
    functions = [{**tool, "strict": strict} for tool in offered]
    body = {
        "model": "default",
        "messages": [{"role": "user", "content": rng.choice(TOOL_QUESTIONS)}],
        "tools": [{"type": "function", "function": f} for f in functions],
        "tool_choice": "required",
        "parallel_tool_calls": rng.random() < 0.5,
        "temperature": rng.choice([0.0, 0.7]),
        "max_tokens": CONSTRAINED_NEW_TOKENS,
    }
    return body, functions


def _run_tools(ctx: LoadContext, session: requests.Session, rng: random.Random, strict: bool) -> Outcome:
    body, functions = _tool_body(rng, strict)
    reply = _post(ctx, session, "/v1/chat/completions", body)
    outcome = _outcome("tool_strict" if strict else "tool_nonstrict", reply, body)
    if not _expect_ok(outcome, body, reply):
        return outcome
    choice = reply.body["choices"][0]
    if choice.get("finish_reason") == "length":
        outcome.truncated += 1
        outcome.note = f"stopped at the token limit, ending {json.dumps(choice['message'])[-80:]!r}"
        return outcome
    outcome.checked += 1
    outcome.violation = check_tool_calls(functions, choice["message"])
    if outcome.violation:
        _keep(outcome, body, reply.body)
    return outcome


def run_tool_strict(ctx: LoadContext, session: requests.Session, rng: random.Random) -> Outcome:
    return _run_tools(ctx, session, rng, strict=True)


def run_tool_nonstrict(ctx: LoadContext, session: requests.Session, rng: random.Random) -> Outcome:
    return _run_tools(ctx, session, rng, strict=False)


def run_stream_generate(ctx: LoadContext, session: requests.Session, rng: random.Random) -> Outcome:
    """A regex-constrained ``/generate`` streamed; its final text is validated."""
    pattern = rng.choice(REGEXES)
    body = {**_generate_body(rng, CONSTRAINED_NEW_TOKENS, regex=pattern), "stream": True}
    reply = _stream(ctx, session, "/generate", body)
    outcome = _outcome("stream_generate", reply, body)
    if not _expect_ok(outcome, body, reply) or outcome.problem:
        return outcome
    if not reply.done or not reply.events or reply.events[-1]["meta_info"].get("finish_reason") is None:
        outcome.bad_response = f"stream of {len(reply.events)} events ended without a finish_reason and [DONE]"
        return _keep(outcome, body, reply.events[-1:] or "")
    text = "".join(e["text"] for e in reply.events) if ctx.incremental_stream else reply.events[-1]["text"]
    final = {"text": text, "meta_info": reply.events[-1]["meta_info"]}
    _check_generated(outcome, body, final, lambda t: check_regex(pattern, t))
    return outcome


def run_stream_chat(ctx: LoadContext, session: requests.Session, rng: random.Random) -> Outcome:
    body = {
        "model": "default",
        "messages": [{"role": "user", "content": rng.choice(PROMPTS)}],
        "max_tokens": rng.randint(8, 48),
        "temperature": rng.choice([0.0, 0.7]),
        "stream": True,
    }
    reply = _stream(ctx, session, "/v1/chat/completions", body)
    outcome = _outcome("stream_chat", reply, body)
    if not _expect_ok(outcome, body, reply) or outcome.problem:
        return outcome
    finished = [c for e in reply.events for c in e.get("choices", []) if c.get("finish_reason")]
    if not reply.done or not finished:
        outcome.bad_response = f"stream of {len(reply.events)} chunks ended without a finish_reason and [DONE]"
        _keep(outcome, body, reply.events[-1:] or "")
    return outcome


def run_n2(ctx: LoadContext, session: requests.Session, rng: random.Random) -> Outcome:
    """Two samples of one regex-constrained prompt (``n=2``); both are validated."""
    pattern = rng.choice(REGEXES)
    body = _generate_body(rng, CONSTRAINED_NEW_TOKENS, regex=pattern, n=2)
    body["sampling_params"]["temperature"] = 1.0
    reply = _post(ctx, session, "/generate", body)
    outcome = _outcome("n2", reply, body)
    if not _expect_ok(outcome, body, reply):
        return outcome
    if not isinstance(reply.body, list) or len(reply.body) != 2:
        outcome.bad_response = f"n=2 answered {type(reply.body).__name__} of {len(reply.body or [])}, not 2 results"
        return _keep(outcome, body, reply.body)
    for result in reply.body:
        _check_generated(outcome, body, result, lambda text: check_regex(pattern, text))
    return outcome


def run_logprobs(ctx: LoadContext, session: requests.Session, rng: random.Random) -> Outcome:
    body = {**_generate_body(rng, rng.randint(4, 32)), "return_logprob": True, "top_logprobs_num": 3}
    with_input = rng.random() < 0.5
    if with_input:
        body["logprob_start_len"] = 0
    reply = _post(ctx, session, "/generate", body)
    outcome = _outcome("logprobs", reply, body)
    if not _expect_ok(outcome, body, reply):
        return outcome
    meta = reply.body["meta_info"]
    out, top = meta.get("output_token_logprobs"), meta.get("output_top_logprobs")
    if out is None or len(out) != meta["completion_tokens"] or top is None or len(top) != len(out):
        outcome.bad_response = (
            f"output_token_logprobs {None if out is None else len(out)} / output_top_logprobs "
            f"{None if top is None else len(top)} for {meta['completion_tokens']} output tokens"
        )
    elif with_input and len(meta.get("input_token_logprobs") or []) != meta["prompt_tokens"]:
        outcome.bad_response = (
            f"input_token_logprobs {len(meta.get('input_token_logprobs') or [])} for {meta['prompt_tokens']} "
            "prompt tokens (logprob_start_len 0)"
        )
    if outcome.bad_response:
        _keep(outcome, body, reply.body)
    return outcome


def run_long_prompt(ctx: LoadContext, session: requests.Session, rng: random.Random) -> Outcome:
    """A prompt of about ``ctx.long_prompt_tokens`` token ids (near the context length): the filler
    repeated from a random offset, so most such prompts share no prefix with an earlier one and are
    prefilled in full."""
    length = max(1, ctx.long_prompt_tokens - rng.randrange(0, 32))
    offset = rng.randrange(len(ctx.filler_ids))
    ids = (ctx.filler_ids * (length // len(ctx.filler_ids) + 2))[offset : offset + length]
    body = {"input_ids": ids, "sampling_params": {"max_new_tokens": LONG_PROMPT_NEW_TOKENS, "temperature": 0.0}}
    reply = _post(ctx, session, "/generate", body)
    outcome = _outcome("long_prompt", reply, body)
    if _expect_ok(outcome, body, reply) and reply.body["meta_info"]["prompt_tokens"] != length:
        outcome.bad_response = f"prompt_tokens {reply.body['meta_info']['prompt_tokens']} for {length} input ids"
        _keep(outcome, body, reply.body)
    outcome.note = f"{length} prompt tokens"
    return outcome


def run_disconnect(ctx: LoadContext, session: requests.Session, rng: random.Random) -> Outcome:
    """A long streamed answer whose client closes the connection after the first chunks."""
    sampling = {"max_new_tokens": LONG_ANSWER_TOKENS, "ignore_eos": True}
    if rng.random() < 0.5:
        path, body = "/generate", {"text": rng.choice(PROMPTS), "sampling_params": sampling, "stream": True}
    else:
        path = "/v1/chat/completions"
        body = {
            "model": "default",
            "messages": [{"role": "user", "content": rng.choice(PROMPTS)}],
            "max_tokens": LONG_ANSWER_TOKENS,
            "ignore_eos": True,
            "stream": True,
        }
    reply = _stream(ctx, session, path, body, stop_after=rng.randint(1, 3))
    outcome = _outcome("disconnect", reply, body)
    _expect_ok(outcome, body, reply)
    outcome.note = f"closed after {len(reply.events)} chunks of {path}"
    return outcome


def run_abort(ctx: LoadContext, session: requests.Session, rng: random.Random) -> Outcome:
    """A long answer aborted through ``/abort_request`` with its rid: streamed (aborted after the
    first chunk) or not (aborted after a random delay, possibly while still queued)."""
    rid = f"soak-abort-{rng.getrandbits(64):016x}"
    body = {
        "rid": rid,
        "text": rng.choice(PROMPTS),
        "sampling_params": {"max_new_tokens": LONG_ANSWER_TOKENS, "ignore_eos": True},
    }
    abort_status: list[Any] = []

    def abort() -> None:
        try:
            abort_status.append(requests.post(ctx.url + "/abort_request", json={"rid": rid}, timeout=30).status_code)
        except requests.RequestException as exc:
            abort_status.append(type(exc).__name__)

    if rng.random() < 0.5:
        body["stream"] = True
        reply: _Reply | _Stream = _stream(ctx, session, "/generate", body, on_first=abort)
        finish = (reply.events[-1]["meta_info"].get("finish_reason") or {}) if reply.events else {}
    else:
        timer = threading.Timer(rng.uniform(0.1, 1.5), abort)
        timer.start()
        reply = _post(ctx, session, "/generate", body)
        timer.join()
        finish = ((reply.body or {}).get("meta_info") or {}).get("finish_reason") or {} if reply.status == 200 else {}
    outcome = _outcome("abort", reply, body)
    _expect_ok(outcome, body, reply)
    outcome.note = f"abort_request {abort_status[0] if abort_status else 'not sent'}, finish {finish.get('type')}"
    if abort_status and isinstance(abort_status[0], int) and abort_status[0] >= 500:
        outcome.wrong_status = f"/abort_request answered {abort_status[0]}"
        _keep(outcome, {"rid": rid}, "")
    return outcome


def _malformed(
    kind: str, ctx: LoadContext, session: requests.Session, body: Any, data: Optional[str] = None
) -> Outcome:
    """Send a malformed request: it must get a 4xx (a 5xx is a failure, so is a 2xx or 3xx)."""
    reply = _post(ctx, session, "/generate", body, data=data)
    outcome = _outcome(kind, reply, data if data is not None else body)
    if reply.status is not None and not 400 <= reply.status < 500:
        if reply.status < 500:
            outcome.wrong_status = f"malformed request answered {reply.status}, not 4xx"
        _keep(outcome, data if data is not None else body, reply.text)
    elif reply.status is not None and re.search(r'File \\?"/', reply.text):
        outcome.note = PATH_NOTE
    return outcome


def run_bad_json(ctx: LoadContext, session: requests.Session, rng: random.Random) -> Outcome:
    data = rng.choice(['{"text": "hi", "sampling_params": {', "{not json", '["text"', ""])
    return _malformed("bad_json", ctx, session, None, data=data)


def run_bad_type(ctx: LoadContext, session: requests.Session, rng: random.Random) -> Outcome:
    body = rng.choice(
        [
            {"text": 123, "sampling_params": {"max_new_tokens": 4}},
            {"text": "hi", "sampling_params": {"max_new_tokens": "ten"}},
            {"text": "hi", "sampling_params": {"temperature": "hot"}},
            {"text": "hi", "sampling_params": {"max_new_tokens": 4, "return_kv_roles": "yes"}},
            {"text": "hi", "sampling_params": {"max_new_tokens": 4, "return_kv_kept": 1}},
            {"text": "hi", "sampling_params": "max_new_tokens=4"},
        ]
    )
    return _malformed("bad_type", ctx, session, body)


def run_bad_batch(ctx: LoadContext, session: requests.Session, rng: random.Random) -> Outcome:
    """A batch whose ``sampling_params`` list is shorter than its ``text`` list."""
    size = rng.randint(2, 4)
    body = {
        "text": [rng.choice(PROMPTS) for _ in range(size)],
        "sampling_params": [{"max_new_tokens": 4} for _ in range(rng.randint(1, size - 1))],
    }
    return _malformed("bad_batch", ctx, session, body)


def run_bad_regex(ctx: LoadContext, session: requests.Session, rng: random.Random) -> Outcome:
    pattern = rng.choice(["([a-z]", "a{3,1}", "(?P<x>a)(?P<x>b)", "[z-a]", "*a"])
    return _malformed("bad_regex", ctx, session, _generate_body(rng, 8, regex=pattern))


def run_bad_input_id(ctx: LoadContext, session: requests.Session, rng: random.Random) -> Outcome:
    bad = rng.choice([10**9, 2**31 - 1, -1])
    ids = [*ctx.filler_ids[:4], bad, *ctx.filler_ids[4:8]]
    return _malformed("bad_input_id", ctx, session, {"input_ids": ids, "sampling_params": {"max_new_tokens": 4}})


def run_empty_text(ctx: LoadContext, session: requests.Session, rng: random.Random) -> Outcome:
    body = rng.choice([{"text": ""}, {"input_ids": []}, {"text": ["hi", ""]}])
    return _malformed("empty_text", ctx, session, {**body, "sampling_params": {"max_new_tokens": 4}})


# Every kind: its runner and how many of each round of the schedule it gets.
KINDS: dict[str, tuple[Callable[[LoadContext, requests.Session, random.Random], Outcome], int]] = {
    "plain": (run_plain, 4),
    "regex": (run_regex, 4),
    "json_schema": (run_json_schema, 4),
    "tool_strict": (run_tool_strict, 3),
    "tool_nonstrict": (run_tool_nonstrict, 3),
    "stream_generate": (run_stream_generate, 2),
    "stream_chat": (run_stream_chat, 2),
    "n2": (run_n2, 2),
    "logprobs": (run_logprobs, 2),
    "kv_roles": (run_kv_roles, 2),
    "long_prompt": (run_long_prompt, 1),
    "disconnect": (run_disconnect, 2),
    "abort": (run_abort, 2),
    "bad_json": (run_bad_json, 1),
    "bad_type": (run_bad_type, 1),
    "bad_batch": (run_bad_batch, 1),
    "bad_regex": (run_bad_regex, 1),
    "bad_input_id": (run_bad_input_id, 1),
    "empty_text": (run_empty_text, 1),
}
MALFORMED_KINDS = ("bad_json", "bad_type", "bad_batch", "bad_regex", "bad_input_id", "empty_text")
# Kinds whose answers are validated against a constraint (violations of tool_nonstrict are expected:
# SGLang constrains a non-strict tool's arguments only to "any JSON object").
CONSTRAINED_KINDS = ("regex", "json_schema", "kv_roles", "n2", "stream_generate", "tool_strict", "tool_nonstrict")
EXPECTED_VIOLATION_KINDS = ("tool_nonstrict",)


def schedule(kinds: list[str], seed: int) -> Iterator[tuple[int, str]]:
    """The load's endless order of (request index, kind), drawn by a generator seeded with ``seed``:
    first every kind of ``kinds`` once, shuffled (so a short run still sends each kind), then rounds
    in which each kind appears as often as its weight, each round shuffled."""
    rng = random.Random(seed)
    deck = list(kinds)
    index = 0
    while True:
        rng.shuffle(deck)
        for kind in deck:
            yield index, kind
            index += 1
        deck = [kind for kind in kinds for _ in range(KINDS[kind][1])]


def run_request(ctx: LoadContext, session: requests.Session, kind: str, seed: int, index: int) -> Outcome:
    """Send the ``index``-th request of a run (kind ``kind``), its body drawn from a generator seeded by
    (``seed``, ``index``); an exception in the client becomes the outcome's ``client_error``."""
    rng = random.Random(f"{seed}:{index}")
    start = time.perf_counter()
    try:
        return KINDS[kind][0](ctx, session, rng)
    except Exception as exc:  # a response of an unexpected shape: keep the run going, report it
        outcome = Outcome(kind, None, time.perf_counter() - start)
        outcome.bad_response = f"client could not read the response: {type(exc).__name__}: {str(exc)[:200]}"
        return outcome
