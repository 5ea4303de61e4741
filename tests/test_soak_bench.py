"""bench.soak: the validators, the schedule, the verdict and the tables (no server; a stub HTTP server
for how responses are classified), and a short soak of a tiny-model server with layer groups and
dropping (marked ``server``)."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Iterator

import pytest
import requests

from bench.soak import (
    ConfigRun,
    PoolReading,
    build_parser,
    failures,
    format_kind_table,
    format_summary_table,
    main,
    markdown_page,
    parse_config,
    percentile,
    summarize,
)
from bench.soak_load import (
    CONSTRAINED_KINDS,
    KINDS,
    REGEXES,
    SCHEMAS,
    TOOLS,
    LoadContext,
    Outcome,
    check_json_schema,
    check_regex,
    check_tool_calls,
    excerpt,
    run_request,
    schedule,
    tool_calls_of,
)

WEATHER = TOOLS[0]


# ---------------------------------------------------------------------------------------------------
# Validators


def test_regex_must_match_the_whole_text():
    assert check_regex(r"\d{4}-\d{2}-\d{2}", "2026-12-07") is None
    assert "does not fully match" in check_regex(r"\d{4}-\d{2}-\d{2}", "2026-12-07 ")
    assert check_regex(r"\d{4}-\d{2}-\d{2}", "x2026-12-07") is not None


def test_json_schema_answers_are_parsed_then_validated():
    schema = SCHEMAS[0]
    assert check_json_schema(schema, '{"name": "Ada", "age": 36, "member": true}') is None
    assert check_json_schema(schema, '{"name": "Ada", "age": 36').startswith("not JSON")
    assert check_json_schema(schema, '{"name": "Ada", "age": 121, "member": true}').startswith("age:")
    assert "required" in check_json_schema(schema, '{"name": "Ada", "age": 3}')
    # a raw control character inside a string is not JSON
    assert check_json_schema(schema, '{"name": "A\x05", "age": 3, "member": false}').startswith("not JSON")


def test_tool_calls_come_from_the_parser_or_from_the_content_array():
    parsed = {"content": "", "tool_calls": [{"function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}}]}
    assert tool_calls_of(parsed) == [("get_weather", '{"city": "Oslo"}')]
    content = {"content": '[{"name": "get_weather", "parameters": {"city": "Oslo"}}]'}
    assert tool_calls_of(content) == [("get_weather", {"city": "Oslo"})]
    assert tool_calls_of({"content": "It is sunny."}) is None
    assert tool_calls_of({"content": "[]"}) is None


def test_tool_call_arguments_are_validated_against_the_called_tools_schema():
    tools = [WEATHER, TOOLS[2]]

    def message(name, arguments):
        return {"content": "", "tool_calls": [{"function": {"name": name, "arguments": arguments}}]}

    assert check_tool_calls(tools, message("get_weather", '{"city": "Paris", "unit": "celsius"}')) is None
    assert check_tool_calls(tools, message("set_alarm", '{"hour": 7, "minute": 30}')) is None
    assert check_tool_calls(tools, message("get_weather", '{"unit": "kelvin"}')).startswith("get_weather: ")
    assert "not JSON" in check_tool_calls(tools, message("get_weather", '{"city": '))
    assert "not an offered tool" in check_tool_calls(tools, message("search_files", "{}"))
    assert check_tool_calls(tools, {"content": "no call"}).startswith("no tool call")
    # a number is valid JSON but not an object of arguments
    assert check_tool_calls(tools, message("get_weather", "3325")) is not None


def test_the_bounded_grammars_admit_what_they_should():
    assert check_regex(REGEXES[0], '[get_weather(city="Paris")]') is None
    assert check_json_schema(SCHEMAS[1], '{"status": "ok", "count": 3, "tags": ["a", "c"]}') is None
    assert check_json_schema(SCHEMAS[1], '{"status": "ok", "count": 3, "tags": ["a", "b", "c", "a"]}') is not None


def test_excerpts_shorten_long_id_lists_and_texts():
    body = {"input_ids": list(range(5000)), "sampling_params": {"max_new_tokens": 8}}
    text = excerpt(body)
    assert "5000 items in all" in text and len(text) < 200
    assert excerpt("x" * 5000).endswith("...") and len(excerpt("x" * 5000)) <= 603


# ---------------------------------------------------------------------------------------------------
# Schedule, statistics, verdict, tables


def test_schedule_sends_every_kind_first_then_weighted_rounds():
    kinds = list(KINDS)
    order = schedule(kinds, seed=3)
    first = [next(order) for _ in range(len(kinds))]
    assert [index for index, _ in first] == list(range(len(kinds)))
    assert sorted(kind for _, kind in first) == sorted(kinds)
    weights = sum(weight for _, weight in KINDS.values())
    second = [kind for _, kind in (next(order) for _ in range(weights))]
    assert all(second.count(kind) == KINDS[kind][1] for kind in kinds)
    again = schedule(kinds, seed=3)
    assert [next(again) for _ in range(len(kinds))] == first
    other = schedule(kinds, seed=4)
    assert [next(other) for _ in range(len(kinds))] != first


def test_percentile_is_the_nearest_rank():
    assert percentile([], 50) is None
    assert percentile([5.0], 99) == 5.0
    values = [float(v) for v in range(1, 101)]
    assert percentile(values, 50) == 50.0 and percentile(values, 99) == 99.0
    assert percentile([3.0, 1.0, 2.0], 50) == 2.0


def _pool(tokens: int, slots: list[int]) -> PoolReading:
    return PoolReading(tokens, tokens * 256, slots, [0] * len(slots), 0)


def _clean_run() -> ConfigRun:
    return ConfigRun(
        name="drop",
        flags=["--kv-policy", "snapkv"],
        kinds_asked=["plain", "regex", "tool_nonstrict", "bad_json", "json_schema", "abort"],
        outcomes=[
            Outcome("plain", 200, 0.1),
            Outcome("plain", 200, 0.3),
            Outcome("regex", 200, 0.2, checked=1),
            Outcome("tool_nonstrict", 200, 0.5, checked=1, violation="get_weather: 'city' is a required property"),
            Outcome("bad_json", 400, 0.01),
            Outcome("json_schema", 200, 0.4, truncated=1),
        ],
        pool_before=_pool(19, [16, 16]),
        pool_after_load=_pool(400, [200, 190]),
        pool_after_flush=_pool(0, [0, 0]),
        flush="flushed (Cache flushed.)",
        health_checks=10,
    )


def test_a_clean_run_passes_and_non_strict_tool_violations_are_reported_not_failed():
    run = _clean_run()
    assert failures(run) == []
    rows = {s.kind: s for s in summarize(run.outcomes)}
    assert rows["plain"].sent == 2 and rows["plain"].statuses == {"200": 2}
    assert rows["plain"].p50_ms == pytest.approx(100.0) and rows["plain"].p99_ms == pytest.approx(300.0)
    assert rows["tool_nonstrict"].violations == 1 and rows["json_schema"].truncated == 1
    summary = format_summary_table([run]).splitlines()[-1]
    assert "| drop | 6 | 5 of 6 | 0 | 0 | 1 of 1 | 0 |" in summary and summary.endswith("| pass |")
    assert "19 tok, slots 16/16, 4864 B" in summary and "0 tok, slots 0/0, 0 B" in summary


@pytest.mark.parametrize(
    "spoil, reason",
    [
        (lambda r: r.outcomes.append(Outcome("plain", 500, 0.1)), "1 responses with a 5xx status"),
        (lambda r: r.outcomes.append(Outcome("bad_batch", 500, 0.1)), "5xx"),
        (lambda r: r.outcomes.append(Outcome("tool_strict", 200, 0.1, violation="x")), "constraint violations"),
        (lambda r: r.outcomes.append(Outcome("n2", 200, 0.1, violation="x")), "constraint violations"),
        (lambda r: r.outcomes.append(Outcome("plain", None, 300.0, hang=True)), "hangs"),
        (lambda r: r.outcomes.append(Outcome("bad_json", 200, 0.1, wrong_status="200")), "wrong statuses"),
        (lambda r: r.outcomes.append(Outcome("logprobs", 200, 0.1, bad_response="x")), "wrong shape"),
        (lambda r: setattr(r, "pool_after_flush", _pool(3, [2, 0])), "after the flush 3 tokens"),
        (lambda r: setattr(r, "pool_after_flush", None), "could not be read"),
        (lambda r: setattr(r, "exit_code", -9), "exited with status -9"),
        (lambda r: setattr(r, "restarted", "pid 1 then 2"), "restarted"),
        (lambda r: setattr(r, "health_after", "/health_generate answered 503"), "/health_generate"),
        (lambda r: setattr(r, "leak_warnings", 2), "memory-leak warnings"),
        (lambda r: setattr(r, "flush", "not flushed after 5 tries: busy"), "not flushed"),
    ],
)
def test_each_target_fails_the_run(spoil, reason):
    run = _clean_run()
    spoil(run)
    found = failures(run)
    assert len(found) == 1 and reason in found[0], found
    assert "FAIL: " in format_summary_table([run])


def test_a_server_that_did_not_start_fails_with_its_reason():
    run = ConfigRun(name="x", flags=[], error="server did not start: server exited with 2:\nbad flag")
    assert failures(run) == ["server did not start: server exited with 2:"]


def test_kind_table_and_markdown_page():
    run = _clean_run()
    run.outcomes.append(Outcome("plain", 500, 0.2, request='{"text": "hi"}', response="Internal Server Error"))
    table = format_kind_table(run)
    assert "| plain | 3 | 200:2 500:1 | 200 | 300 | - | - | - | 0 | 0 | 0 |" in table
    assert "| tool_nonstrict | 1 | 200:1 | 500 | 500 | 1 | 1 | 0 | 0 | 0 | 0 |" in table
    assert "| regex | 1 | 200:1 | 200 | 200 | 1 | 0 | 0 |" in table
    header = {
        "command": "python -m bench.soak --minutes 3",
        "date": "2026-12-07T00:00:00+00:00",
        "machine": {"platform": "Linux", "processor": "x86_64", "nproc": 2},
        "commit": "abc",
        "settings": {"minutes": 3.0, "concurrency": 4, "seed": 0, "request_timeout": 300.0, "server_args": ""},
    }
    page = markdown_page(header, [run], note="Three minutes, not ten.")
    assert page.startswith("# Soak test") and "- command: `python -m bench.soak --minutes 3`" in page
    assert "nproc 2" in page and "- commit: abc" in page and "Three minutes, not ten." in page
    assert "- 5xx, `plain`, status 500" in page and 'request: `{"text": "hi"}`' in page
    assert "- expected violation, `tool_nonstrict`" in page
    assert "- kinds not sent in the time: abort" in page
    assert "- 4xx error bodies that name a source file path: 0 of 1 malformed requests" in page


def test_pool_cells_show_up_to_four_groups_one_by_one():
    run = _clean_run()
    run.pool_after_load = PoolReading(10, 2560, [5] * 24, [0] * 24, 0)
    run.pool_after_flush = PoolReading(0, 0, [0, 1] + [0] * 22, [0] * 24, 0)
    row = format_summary_table([run]).splitlines()[-1]
    assert "10 tok, slots 5 in each of 24 groups, 2560 B" in row and "0 tok, slots 0-1 in 24 groups, 0 B" in row


def test_pool_reading_from_server_info():
    info = {
        "internal_states": [
            {
                "sglang_pask": {
                    "kv_pool": {
                        "tokens_in_use": 19,
                        "bytes_in_use": 8192,
                        "running_requests": 1,
                        "groups": [
                            {"slots_in_use": 16, "lowbit_slots_in_use": 2},
                            {"slots_in_use": 16, "lowbit_slots_in_use": 0},
                        ],
                    }
                }
            }
        ]
    }
    reading = PoolReading.of(info)
    assert reading == PoolReading(19, 8192, [16, 16], [2, 0], 1) and not reading.empty
    assert PoolReading.of({"internal_states": [{}]}) is None
    assert PoolReading(0, 0, [0, 0], [0, 0], 0).empty


def test_configs_are_names_or_name_equals_flags():
    assert parse_config("full") == ("full", [])
    assert parse_config("drop033")[1][-2:] == ["--kv-layer-groups", "4"]
    assert parse_config("mine=--kv-policy snapkv --kv-budget 0.5") == (
        "mine",
        ["--kv-policy", "snapkv", "--kv-budget", "0.5"],
    )
    args = build_parser().parse_args([])
    assert [name for name, _ in args.configs] == ["full", "drop033", "pask-lowbit", "structkv"]
    assert args.minutes == 10 and args.concurrency == 4
    pask = dict(args.configs)["pask-lowbit"]
    assert (
        " ".join(pask) == "--kv-policy pask --kv-budget 0.02 --kv-layer-groups 4 --kv-dropped k4v2 --kv-decode lowbit"
    )


@pytest.mark.parametrize(
    "argv",
    [
        ["--configs", "nonsense"],
        ["--url", "http://127.0.0.1:1", "--configs", "full"],
        ["--url", "http://127.0.0.1:1", "--server-args", "--model-path x y"],
        ["--minutes", "0"],
        ["--configs", "full", "full"],
        ["--kinds", "nope"],
        ["--json", "/nonexistent-dir/x.json"],
    ],
)
def test_usage_errors_exit_2(argv):
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2


# ---------------------------------------------------------------------------------------------------
# How responses are classified, against a stub server


class _Stub(BaseHTTPRequestHandler):
    """Answers every POST with the status and body the test set (``sleep`` first, to play a hang)."""

    status = 200
    body: object = {}
    sleep = 0.0
    stream_then_stall = False

    def do_POST(self) -> None:  # noqa: N802 (http.server's name)
        self.rfile.read(int(self.headers.get("content-length") or 0))
        if type(self).stream_then_stall:  # one event, then silence: a stream that hangs midway
            self.send_response(200)
            self.send_header("content-type", "text/event-stream")
            self.end_headers()
            self.wfile.write(b'data: {"text": "a", "meta_info": {"finish_reason": null}}\n\n')
            self.wfile.flush()
            time.sleep(1.5)
            return
        time.sleep(type(self).sleep)
        payload = json.dumps(type(self).body).encode()
        try:
            self.send_response(type(self).status)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)
        except (BrokenPipeError, ConnectionResetError):
            pass

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture()
def stub() -> Iterator[tuple[type[_Stub], LoadContext]]:
    handler = type("Handler", (_Stub,), {})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    ctx = LoadContext(f"http://127.0.0.1:{server.server_port}", 1.0, 4096, 100, [1, 2, 3, 4, 5, 6, 7, 8])
    try:
        yield handler, ctx
    finally:
        server.shutdown()
        server.server_close()


def _send(ctx: LoadContext, kind: str) -> Outcome:
    with requests.Session() as session:
        return run_request(ctx, session, kind, seed=0, index=0)


def test_malformed_requests_must_get_a_4xx(stub):
    handler, ctx = stub
    handler.status, handler.body = 400, {"error": {"message": "bad"}}
    assert not _send(ctx, "bad_batch").problem
    handler.status = 500
    outcome = _send(ctx, "bad_batch")
    assert outcome.problem and outcome.status == 500 and "sampling_params" in outcome.request
    handler.status = 200
    outcome = _send(ctx, "bad_regex")
    assert outcome.wrong_status == "malformed request answered 200, not 4xx"
    handler.status, handler.body = 400, {"message": 'File "/x/y.py", line 3'}
    assert _send(ctx, "bad_type").note == "error body names a source file path"


def test_constrained_answers_are_validated_and_truncation_is_not_a_violation(stub):
    handler, ctx = stub
    handler.body = {"text": "not json", "meta_info": {"finish_reason": {"type": "stop"}}}
    outcome = _send(ctx, "json_schema")
    assert outcome.checked == 1 and outcome.violation.startswith("not JSON") and outcome.request
    handler.body["meta_info"]["finish_reason"] = {"type": "length", "length": 160}
    outcome = _send(ctx, "json_schema")
    assert (outcome.checked, outcome.truncated, outcome.violation) == (0, 1, None)
    assert outcome.note == "stopped at the token limit, ending 'not json'"
    handler.body = {"text": "x", "meta_info": {"finish_reason": {"type": "stop"}}}
    outcome = _send(ctx, "n2")
    assert outcome.bad_response.startswith("n=2 answered dict")


def test_a_valid_request_refused_a_5xx_a_hang_and_a_bad_shape(stub):
    handler, ctx = stub
    handler.status, handler.body = 400, {"error": "no"}
    assert _send(ctx, "plain").wrong_status == "valid request answered 400"
    handler.status = 503
    assert _send(ctx, "plain").status == 503 and _send(ctx, "plain").problem
    handler.status, handler.body = 200, {"meta_info": {}}
    assert _send(ctx, "plain").bad_response == "no text in the response"
    handler.sleep = 1.5
    outcome = _send(ctx, "plain")
    assert outcome.hang and outcome.status is None and outcome.problem


def test_a_stream_that_stops_midway_is_a_hang(stub):
    handler, ctx = stub
    handler.stream_then_stall = True
    outcome = _send(ctx, "stream_chat")
    assert outcome.hang and outcome.client_error is None and outcome.problem


# ---------------------------------------------------------------------------------------------------
# A short soak of a real server (tiny random model: its answers are random, so the constraints are
# the check)

# Layer groups and dropping on the tiny model's 2 layers.
TINY_CONFIG = "tiny-drop=--kv-policy snapkv --kv-budget 0.5 --kv-layer-groups 0-0,1-1"
SOAK_MINUTES = "1"
# The shared tiny servers' SGLang flag (tests/conftest.py; not imported from there, since
# tests/structure has a conftest of its own): a random model favours whitespace.
TINY_SGLANG_FLAGS = ["--constrained-json-disable-any-whitespace"]


@pytest.mark.server
def test_short_soak_of_a_tiny_model_server(tiny_model_dir: Path, tmp_path: Path):
    report = tmp_path / "soak.json"
    server_args = " ".join(["--model-path", str(tiny_model_dir), *TINY_SGLANG_FLAGS])
    argv = ["--minutes", SOAK_MINUTES, "--configs", TINY_CONFIG, "--server-args", server_args, "--quiet"]
    argv += ["--request-timeout", "120", "--json", str(report), "--markdown", str(tmp_path / "soak.md")]
    status = main(argv)
    record = json.loads(report.read_text())
    (config,) = record["configs"]
    assert config["error"] is None
    kinds = {row["kind"]: row for row in config["kinds"]}
    assert set(kinds) == set(KINDS), f"kinds never sent: {set(KINDS) - set(kinds)}"
    problems = json.dumps(config["problems"], indent=1)[:4000]
    assert not any(int(s) >= 500 for row in kinds.values() for s in row["statuses"] if s.isdigit()), problems
    violations = {k: row["violations"] for k, row in kinds.items() if k != "tool_nonstrict" and row["violations"]}
    assert not violations, problems
    assert sum(kinds[k]["checked"] for k in CONSTRAINED_KINDS) > 0
    assert config["pool_after_flush"] is not None
    assert config["pool_after_flush"]["tokens_in_use"] == 0 and not any(config["pool_after_flush"]["slots_in_use"])
    assert config["exit_code"] is None and config["restarted"] is None and config["health_after"] is None
    assert status == 0 and record["passed"], config["failures"]
