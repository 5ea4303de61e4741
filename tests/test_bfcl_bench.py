"""``python -m bench.bfcl`` end to end against a stub OpenAI-compatible server on 127.0.0.1.

The stub answers the first item of each category with BFCL's reference answer and the second with a
wrong call, so the expected scores are known exactly. Asked through the tools path (``--api tools``),
it answers with ``tool_calls``: the reference calls, a call with a key its tool does not have, or
arguments that are not JSON.
"""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from bench.bfcl import build_parser, disagreements, format_item_by_item, main, select_items, server_flags
from sglang_pask.bfcl.offline import import_bfcl
from sglang_pask.bfcl.oracle import oracle_answer
from sglang_pask.bfcl.prompt import build_messages
from sglang_pask.bfcl.report import ConfigResult, ItemResult

CATEGORIES = ["simple_python", "parallel_multiple"]
# Requests with this answer cap get a slow reply for the second item (see stub_server).
SLOW_MAX_TOKENS = 77
# Tools-path requests with this answer cap get text instead of tool calls for the first item.
NO_CALLS_MAX_TOKENS = 55


def _tool_calls(item, index: int) -> list[dict]:
    """The stub's tool calls: the reference calls (even index), the first reference call with a key its
    tool lacks (index 1), arguments that are not JSON (index 3)."""
    api = import_bfcl()
    calls = [
        (name, json.dumps(arguments))
        for call in api.decode_ast(oracle_answer(item), api.return_format_python)
        for name, arguments in call.items()
    ]
    if index == 1:
        calls = [(calls[0][0], json.dumps({**json.loads(calls[0][1]), "no_such_key": 1}))]
    elif index == 3:
        calls[-1] = (calls[-1][0], "{not json")
    return [
        {"id": f"call_{i}", "type": "function", "function": {"name": name, "arguments": arguments}}
        for i, (name, arguments) in enumerate(calls)
    ]


@pytest.fixture()
def stub_server():
    items = select_items(CATEGORIES, None, None, 2)
    by_prompt = {json.dumps(build_messages(it)): (i, it) for i, it in enumerate(items)}
    by_question = {json.dumps(it.messages): (i, it) for i, it in enumerate(items)}  # the tools path
    requests_seen: list[dict] = []

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):  # keep pytest output clean
            pass

        def _reply(self, payload: dict) -> None:
            data = json.dumps(payload).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self):
            self._reply({"data": [{"id": "stub-model"}]})

        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            requests_seen.append(body)
            if "tools" in body:
                index, item = by_question[json.dumps(body["messages"])]
                message = {"role": "assistant", "content": None, "tool_calls": _tool_calls(item, index)}
                if body["max_tokens"] == NO_CALLS_MAX_TOKENS and index == 0:
                    message = {"role": "assistant", "content": "I cannot help with that.", "tool_calls": None}
                finish = "tool_calls" if message["tool_calls"] else "stop"
                self._reply(
                    {
                        "choices": [{"message": message, "finish_reason": finish}],
                        "usage": {"prompt_tokens": 200 + index, "completion_tokens": 20},
                    }
                )
                return
            index, item = by_prompt[json.dumps(body["messages"])]
            if body["max_tokens"] == SLOW_MAX_TOKENS and index == 1:
                time.sleep(1.5)  # past the test's --request-timeout
            text = oracle_answer(item) if index % 2 == 0 else "[no_such_function(x=1)]"
            self._reply(
                {
                    "choices": [{"message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
                    "usage": {"prompt_tokens": 100 + index, "completion_tokens": 10},
                }
            )

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", requests_seen
    finally:
        server.shutdown()
        server.server_close()


def test_bench_scores_writes_json_markdown_and_plot(stub_server, tmp_path, capsys):
    url, requests_seen = stub_server
    out_json, out_md, out_png = tmp_path / "r.json", tmp_path / "r.md", tmp_path / "r.png"
    rc = main(
        [
            "--url",
            url,
            "--categories",
            *CATEGORIES,
            "--limit",
            "2",
            "--concurrency",
            "3",
            "--max-tokens",
            "64",
            "--json",
            str(out_json),
            "--markdown",
            str(out_md),
            "--plot",
            str(out_png),
        ]
    )
    assert rc == 0
    assert len(requests_seen) == 4
    for body in requests_seen:
        assert body["model"] == "stub-model"
        assert body["temperature"] == 0.0 and body["max_tokens"] == 64
        assert body["ebnf"].startswith('root ::= "["') and "regex" not in body
    record = json.loads(out_json.read_text())
    (config,) = record["configs"]
    assert (config["policy"], config["budget"]) == ("full", 1.0)
    assert config["categories"] == {c: {"n": 2, "correct": 1, "accuracy": 50.0} for c in CATEGORIES}
    assert config["average"] == 50.0
    assert [r["valid"] for r in config["items"]] == [True, False, True, False]
    assert config["items"][1]["error_type"] == "simple_function_checker:wrong_func_name"
    assert record["radix_cache"] is None  # a running server: the bench does not know its setting
    assert record["commit"] and record["machine"]["nproc"] >= 1 and record["command"].startswith("python -m bench.bfcl")
    markdown = out_md.read_text()
    assert "| simple_python | 50.0 (1/2) |" in markdown and "**50.0**" in markdown
    assert out_png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "| **average** | **50.0** |" in capsys.readouterr().out
    # The saved JSON renders the same report again without a server.
    again_md, again_png = tmp_path / "again.md", tmp_path / "again.png"
    assert main(["--from-json", str(out_json), "--markdown", str(again_md), "--plot", str(again_png)]) == 0
    assert again_md.read_text() == markdown
    assert again_png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_runs_over_the_same_items_render_side_by_side(stub_server, tmp_path, capsys):
    url, requests_seen = stub_server
    common = ["--url", url, "--categories", *CATEGORIES, "--limit", "2"]
    full, snapkv, fewer = tmp_path / "full.json", tmp_path / "snapkv.json", tmp_path / "fewer.json"
    assert main([*common, "--json", str(full)]) == 0
    assert main([*common, "--policies", "snapkv", "--budgets", "0.33", "--json", str(snapkv)]) == 0
    merged_md, merged_json = tmp_path / "merged.md", tmp_path / "merged.json"
    assert main(["--from-json", str(full), str(snapkv), "--markdown", str(merged_md), "--json", str(merged_json)]) == 0
    markdown = merged_md.read_text()
    assert "full@1" in markdown and "snapkv@0.33" in markdown and "- 2 runs, side by side" in markdown
    # Full KV is the default reference of the paired differences; the stub answers alike under both.
    assert "| config | minus full@1 |" in markdown and "| snapkv@0.33 | +0.0 [+0.0, +0.0] |" in markdown
    assert (
        main(
            [
                "--from-json",
                str(full),
                str(snapkv),
                "--compare-to",
                "full@1.0",
                "snapkv@0.33",
                "--markdown",
                str(merged_md),
            ]
        )
        == 0
    )
    assert "| config | minus full@1 | minus snapkv@0.33 |" in merged_md.read_text()
    for wrong in ("pask@0.33", "full"):
        with pytest.raises(SystemExit) as exit_info:
            main(["--from-json", str(full), str(snapkv), "--compare-to", wrong])
        assert exit_info.value.code == 2
    assert "--compare-to" in capsys.readouterr().err
    # A reference outside the configurations to run is refused before any request is sent.
    sent = len(requests_seen)
    with pytest.raises(SystemExit) as exit_info:
        main([*common, "--compare-to", "snapkv@0.33"])
    assert exit_info.value.code == 2 and len(requests_seen) == sent
    record = json.loads(merged_json.read_text())
    assert [(c["policy"], c["budget"]) for c in record["configs"]] == [("full", 1.0), ("snapkv", 0.33)]
    assert len(record["runs"]) == 2
    # A configuration that answered an item twice is refused.
    assert main(["--url", url, "--categories", *CATEGORIES, "--limit", "1", "--json", str(fewer)]) == 0
    for files in ([full, fewer], [full, full]):
        with pytest.raises(SystemExit) as exit_info:
            main(["--from-json", *map(str, files)])
        assert exit_info.value.code == 2
    assert (
        "configuration full@1 answered simple_python_0 in more than one run (2 items twice)" in capsys.readouterr().err
    )


def test_a_tagged_run_stays_apart_from_an_untagged_run_of_the_same_configuration(stub_server, tmp_path, capsys):
    url, _ = stub_server
    common = ["--url", url, "--categories", *CATEGORIES, "--limit", "2", "--policies", "snapkv", "--budgets", "0.33"]
    plain, other_flags = tmp_path / "plain.json", tmp_path / "other:flags.json"
    assert main([*common, "--json", str(plain)]) == 0
    assert main([*common, "--json", str(other_flags)]) == 0
    with pytest.raises(SystemExit):  # untagged, the same configuration answered every item twice
        main(["--from-json", str(plain), str(other_flags)])
    merged_json, merged_md = tmp_path / "merged.json", tmp_path / "merged.md"
    # A file whose own name holds ':' is read as that file; the tag is what follows the last ':'.
    assert (
        main(
            [
                "--from-json",
                str(plain),
                f"{other_flags}:k4v2",
                "--compare-to",
                "snapkv-k4v2@0.33",
                "--json",
                str(merged_json),
                "--markdown",
                str(merged_md),
            ]
        )
        == 0
    )
    record = json.loads(merged_json.read_text())
    assert [(c["policy"], c["budget"]) for c in record["configs"]] == [("snapkv", 0.33), ("snapkv-k4v2", 0.33)]
    plain_items, tagged_items = ([(i["id"], i["output"]) for i in c["items"]] for c in record["configs"])
    assert plain_items == tagged_items and len(plain_items) == 2 * len(CATEGORIES)
    assert "| config | minus snapkv-k4v2@0.33 |" in merged_md.read_text()
    for word, message in ((f"{plain}:", "ends with ':' but names no tag"), (f"{plain}:a/b", "file not found")):
        with pytest.raises(SystemExit) as exit_info:
            main(["--from-json", word])
        assert exit_info.value.code == 2 and message in capsys.readouterr().err


def test_only_picks_configurations_in_its_order_and_leaves_out_runs_over_other_items(stub_server, tmp_path, capsys):
    url, _ = stub_server
    common = ["--url", url, "--categories", *CATEGORIES]
    both, snapkv, fewer = (tmp_path / f"{name}.json" for name in ("both", "snapkv", "fewer"))
    assert main([*common, "--limit", "2", "--json", str(both)]) == 0
    assert main([*common, "--limit", "2", "--policies", "snapkv", "--budgets", "0.33", "--json", str(snapkv)]) == 0
    assert main([*common, "--limit", "1", "--policies", "h2o", "--budgets", "0.2", "--json", str(fewer)]) == 0
    merged = tmp_path / "merged.json"
    assert (
        main(
            [
                "--from-json",
                str(both),
                str(snapkv),
                str(fewer),
                "--only",
                "snapkv@0.33",
                "full@1",
                "--json",
                str(merged),
            ]
        )
        == 0
    )
    record = json.loads(merged.read_text())
    assert [(c["policy"], c["budget"]) for c in record["configs"]] == [("snapkv", 0.33), ("full", 1.0)]
    assert len(record["runs"]) == 2  # the h2o run holds none of the configurations shown
    for argv, message in (
        (["--from-json", str(both), "--only", "pask@0.33"], "--only: pask@0.33 in none of the files (full@1)"),
        (["--from-json", str(both), "--only", "full"], "--only: 'full' is not POLICY@BUDGET"),
        ([*common, "--only", "full@1"], "--only: chooses among --from-json's configurations"),
    ):
        with pytest.raises(SystemExit) as exit_info:
            main(argv)
        assert exit_info.value.code == 2 and message in capsys.readouterr().err


def test_runs_of_a_configuration_over_disjoint_items_pool_into_one_table(stub_server, tmp_path, capsys):
    url, _ = stub_server
    items = select_items(CATEGORIES, None, None, 2)
    batches = {"first": items[0::2], "second": items[1::2]}  # the stub answers the first items right
    runs = {}
    for batch, chosen in batches.items():
        ids = tmp_path / f"{batch}.txt"
        ids.write_text("\n".join(it.id for it in chosen) + "\n")
        for policy, budget in (("full", "1"), ("snapkv", "0.33")):
            runs[policy, batch] = tmp_path / f"{policy}_{batch}.json"
            assert (
                main(
                    [
                        "--url",
                        url,
                        "--ids",
                        str(ids),
                        "--policies",
                        policy,
                        "--budgets",
                        budget,
                        "--json",
                        str(runs[policy, batch]),
                    ]
                )
                == 0
            )
    pooled_json, pooled_md = tmp_path / "pooled.json", tmp_path / "pooled.md"
    assert (
        main(["--from-json", *map(str, runs.values()), "--json", str(pooled_json), "--markdown", str(pooled_md)]) == 0
    )
    record = json.loads(pooled_json.read_text())
    assert record["n_items"] == 4 and record["ids_file"] is None and len(record["runs"]) == 4
    for config in record["configs"]:
        assert [i["id"] for i in config["items"]] == [it.id for it in [*batches["first"], *batches["second"]]]
        assert config["average"] == 50.0 and config["categories"]["simple_python"] == {
            "n": 2,
            "correct": 1,
            "accuracy": 50.0,
        }
        assert config["wall_s"] == pytest.approx(
            sum(json.loads(runs[config["policy"], batch].read_text())["configs"][0]["wall_s"] for batch in batches)
        )
    markdown = pooled_md.read_text()
    assert "| simple_python | 50.0 (1/2) | 50.0 (1/2) |" in markdown and "- 4 runs, side by side" in markdown
    # Configurations that end with different items are refused.
    with pytest.raises(SystemExit) as exit_info:
        main(["--from-json", str(runs["full", "first"]), str(runs["full", "second"]), str(runs["snapkv", "first"])])
    assert exit_info.value.code == 2
    assert "configuration snapkv@0.33 answered other items than full@1" in capsys.readouterr().err


def test_bench_sends_the_chosen_grammar(stub_server):
    url, requests_seen = stub_server
    assert main(["--url", url, "--categories", "simple_python", "--limit", "1", "--grammar", "regex"]) == 0
    assert main(["--url", url, "--categories", "simple_python", "--limit", "1", "--grammar", "none"]) == 0
    assert main(["--url", url, "--categories", "simple_python", "--limit", "1", "--grammar", "ebnf-strict"]) == 0
    with_regex, unconstrained, strict = requests_seen
    assert "ebnf" not in with_regex and with_regex["regex"].startswith(r"\[(")
    assert not {"regex", "ebnf"} & set(unconstrained)
    # the strict grammar travels in SGLang's ebnf sampling param: its required arguments are not optional
    assert "regex" not in strict and strict["ebnf"].startswith('root ::= "["') and 'first_0_0 ")"' in strict["ebnf"]


def test_an_answer_past_the_request_timeout_counts_as_incorrect_and_the_run_goes_on(stub_server, tmp_path):
    url, _ = stub_server
    out_json = tmp_path / "r.json"
    assert (
        main(
            [
                "--url",
                url,
                "--categories",
                *CATEGORIES,
                "--limit",
                "2",
                "--max-tokens",
                str(SLOW_MAX_TOKENS),
                "--request-timeout",
                "0.5",
                "--json",
                str(out_json),
            ]
        )
        == 0
    )
    (config,) = json.loads(out_json.read_text())["configs"]
    timed_out = [r for r in config["items"] if r["error_type"] == "request_timeout"]
    assert [(r["id"], r["valid"], r["output"], r["finish_reason"]) for r in timed_out] == [
        (config["items"][1]["id"], False, "", "timeout")
    ]
    assert [r["valid"] for r in config["items"]] == [True, False, True, False]


def test_servers_started_by_the_bench_run_without_the_radix_cache_unless_asked():
    # Off by default: each item is compressed by its own question, whatever ran before it.
    assert server_flags("--kv-layer-groups 4", "snapkv", 0.33, radix_cache=False) == [
        "--kv-layer-groups",
        "4",
        "--kv-policy",
        "snapkv",
        "--kv-budget",
        "0.33",
        "--disable-radix-cache",
    ]
    assert "--disable-radix-cache" not in server_flags("", "pask", 0.2, radix_cache=True)
    # Given by the user already: not repeated.
    assert server_flags("--disable-radix-cache", "full", 1.0, radix_cache=False).count("--disable-radix-cache") == 1


def test_the_bench_gives_its_pask_policy_file_to_the_pask_servers_only(tmp_path):
    policy_file = str(tmp_path / "policy.json")
    assert server_flags("", "pask", 0.28, radix_cache=True, pask_policy=policy_file) == [
        "--kv-policy",
        "pask",
        "--kv-budget",
        "0.28",
        "--pask-policy",
        policy_file,
    ]
    assert "--pask-policy" not in server_flags("", "full", 1.0, radix_cache=True, pask_policy=policy_file)
    assert "--pask-policy" not in server_flags("", "snapkv", 0.28, radix_cache=True, pask_policy=policy_file)


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (
            ["--server-args", "", "--policies", "full", "snapkv", "--pask-policy", "{file}"],
            "--pask-policy: no pask configuration to use it (--policies full snapkv)",
        ),
        (["--server-args", "", "--policies", "pask", "--pask-policy", "{missing}"], "--pask-policy: no such file: "),
        (
            ["--url", "http://127.0.0.1:9", "--policies", "pask", "--budgets", "0.3", "--pask-policy", "{file}"],
            "--pask-policy: a running server (--url) has its policy already",
        ),
        (
            ["--server-args=--kv-layer-groups 4 --pask-policy {file}", "--policies", "full", "pask"],
            "--server-args holds --pask-policy, which the launcher refuses for full: give it as the bench's own",
        ),
    ],
)
def test_a_pask_policy_file_no_server_would_read_is_refused_before_any_server_starts(tmp_path, capsys, flags, message):
    policy_file = tmp_path / "policy.json"
    policy_file.write_text("{}")
    argv = [f.format(file=policy_file, missing=tmp_path / "missing.json") for f in flags]
    with pytest.raises(SystemExit) as exit_info:
        main([*argv, "--categories", *CATEGORIES, "--limit", "1"])
    assert exit_info.value.code == 2 and message in capsys.readouterr().err


def test_a_configuration_whose_server_dies_ends_the_run_but_keeps_the_finished_ones(
    stub_server, tmp_path, monkeypatch, capsys
):
    import bench.bfcl as bfcl

    url, _ = stub_server

    class StubOrDeadServer:
        """The first configuration's server is the stub; the second one's URL has nothing listening."""

        started: list[list[str]] = []

        def __init__(self, server_args, log_path, port=None):
            self.started.append(server_args)
            self.url = url if len(self.started) == 1 else "http://127.0.0.1:9"

        def wait_ready(self, timeout_s=600.0):
            return self

        def stop(self):
            pass

        def log_tail(self, lines=30):
            return "Killed (out of memory)"

    monkeypatch.setattr(bfcl, "ServerProcess", StubOrDeadServer)
    monkeypatch.setattr(bfcl, "served_model", lambda server_url: "stub-model")
    out_json, out_md = tmp_path / "r.json", tmp_path / "r.md"
    code = main(
        [
            "--server-args",
            "",
            "--categories",
            *CATEGORIES,
            "--limit",
            "2",
            "--policies",
            "full",
            "snapkv",
            "--budgets",
            "0.5",
            "--json",
            str(out_json),
            "--markdown",
            str(out_md),
        ]
    )
    assert code == 1
    err = capsys.readouterr().err
    assert "error: the snapkv@0.5 run failed (ConnectionError" in err and "Killed (out of memory)" in err
    record = json.loads(out_json.read_text())
    assert record["complete"] is False and "snapkv@0.5" in record["error"]
    assert [c["policy"] for c in record["configs"]] == ["full"]
    assert [r["valid"] for r in record["configs"][0]["items"]] == [True, False, True, False]
    assert "- **incomplete**: the snapkv@0.5 run failed" in out_md.read_text()


def test_from_json_refuses_flags_that_only_shape_a_run(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["--from-json", str(tmp_path / "never_read.json"), "--limit", "3", "--radix-cache"])
    assert exit_info.value.code == 2
    assert "error: --limit, --radix-cache: only shape a run; --from-json runs nothing" in capsys.readouterr().err


def test_every_flag_is_either_a_run_flag_or_meaningful_in_a_replay():
    from bench.bfcl import LIVE_RUN_FLAGS

    dests = {a.dest for a in build_parser()._actions} - {"help"}
    assert set(LIVE_RUN_FLAGS) <= dests
    assert dests - set(LIVE_RUN_FLAGS) == {
        "url",
        "server_args",
        "from_json",
        "json",
        "markdown",
        "plot",
        "compare_to",
        "only",
    }


@pytest.mark.parametrize("content", ["[1, 2]", '{"command": "x"}', '{"configs": 3}'])
def test_from_json_refuses_json_that_is_not_a_run(tmp_path, capsys, content):
    path = tmp_path / "other.json"
    path.write_text(content)
    with pytest.raises(SystemExit) as exit_info:
        main(["--from-json", f"{path}:tag"])
    assert exit_info.value.code == 2
    assert f"--from-json: {path} is not a python -m bench.bfcl --json file" in capsys.readouterr().err


def test_from_json_refuses_a_non_json_file(tmp_path, capsys):  # the shared reader (tests/test_bench_common.py)
    path = tmp_path / "run.json"
    path.write_text("{not json")
    with pytest.raises(SystemExit) as exit_info:
        main(["--from-json", str(path)])
    assert exit_info.value.code == 2 and "--from-json: " in capsys.readouterr().err


def _config(policy: str, budget: float, verdicts: dict[str, bool]) -> ConfigResult:
    """A configuration whose items (all ``simple_python``) have these verdicts."""
    items = [
        ItemResult(
            id=i,
            category="simple_python",
            output="",
            valid=v,
            error_type="",
            latency_s=0.0,
            prompt_tokens=1,
            completion_tokens=1,
            finish_reason="stop",
        )
        for i, v in verdicts.items()
    ]
    return ConfigResult(policy, budget, items)


def test_item_by_item_counts_the_items_only_one_side_answered_and_tests_the_split():
    # a: right on 0-9 and 12; b: right on 10-12. Only a: 10 items, only b: 2 (12 is right for both).
    a = _config("pask", 0.28, {f"i{k}": k < 10 or k == 12 for k in range(14)})
    b = _config("full", 1.0, {f"i{k}": k >= 10 and k != 13 for k in range(14)})
    assert disagreements(a, b) == (10, 2) and disagreements(b, a) == (2, 10)
    table = format_item_by_item([b, a], [b])
    # Exact two-sided sign test: P(X <= 2 | n = 12, 1/2) * 2 = 2 * 79 / 4096.
    assert table.splitlines() == [
        "| config | against full@1 |",
        "|---|---:|",
        "| full@1 | - |",
        f"| pask@0.28 | 10 : 2 (p = {2 * 79 / 4096:.2g}) |",
    ]
    other_items = _config("snapkv", 0.28, {"x": True})
    with pytest.raises(ValueError, match="did not answer the same items"):
        disagreements(other_items, b)


def test_the_tools_path_sends_the_functions_as_tools_and_scores_the_returned_calls(stub_server, tmp_path, capsys):
    url, requests_seen = stub_server
    out_json, out_md = tmp_path / "tools.json", tmp_path / "tools.md"
    common = ["--url", url, "--api", "tools", "--categories", *CATEGORIES, "--limit", "2"]
    assert main([*common, "--json", str(out_json), "--markdown", str(out_md)]) == 0
    items = select_items(CATEGORIES, None, None, 2)
    assert len(requests_seen) == 4
    for body in sorted(requests_seen, key=lambda b: [it.messages for it in items].index(b["messages"])):
        item = items[[it.messages for it in items].index(body["messages"])]
        assert body["tool_choice"] == "required" and body["temperature"] == 0.0 and body["max_tokens"] == 256
        assert not {"ebnf", "regex"} & set(body)  # no grammar of the bench's own
        assert body["messages"] == item.messages  # the question alone: the chat template renders the tools
        assert [t["function"]["name"] for t in body["tools"]] == [f["name"] for f in item.functions]
        assert all(t["type"] == "function" and t["function"]["parameters"]["type"] == "object" for t in body["tools"])
        assert '"dict"' not in json.dumps(body["tools"]) and '"float"' not in json.dumps(body["tools"])
    record = json.loads(out_json.read_text())
    assert record["api"] == "tools" and record["grammar"] is None
    (config,) = record["configs"]
    by_id = {r["id"]: r for r in config["items"]}
    first, extra_key, second, unparsable = (by_id[it.id] for it in items)
    assert (first["valid"], second["valid"]) == (True, True) and first["output"].startswith("[calculate_triangle_area(")
    assert (extra_key["valid"], extra_key["error_type"]) == (False, "simple_function_checker:unexpected_param")
    assert (unparsable["valid"], unparsable["error_type"]) == (False, "tools:unparsable_arguments")
    assert json.loads(unparsable["output"])[-1]["arguments"] == "{not json"
    calls = config["tool_calls"]
    assert [c["schema_errors"] for c in calls[items[0].id]] == [[]]
    assert calls[items[1].id][0]["schema_errors"] == [
        "(arguments): Additional properties are not allowed ('no_such_key' was unexpected)"
    ]
    assert calls[items[3].id][-1]["schema_errors"][0].startswith("arguments are not JSON")
    n_calls = sum(len(c) for c in calls.values())
    markdown = out_md.read_text()
    assert 'OpenAI tools (tool_choice "required"' in markdown
    assert f"| full@1 | 4 | 0 | 1 | {n_calls} | 2 | 2 |" in markdown
    assert "| **average** | **50.0** |" in capsys.readouterr().out
    # No tool call: wrong, with the text as the output; the run goes on.
    no_calls = tmp_path / "no_calls.json"
    assert main([*common, "--max-tokens", str(NO_CALLS_MAX_TOKENS), "--json", str(no_calls)]) == 0
    (config,) = json.loads(no_calls.read_text())["configs"]
    assert (config["items"][0]["valid"], config["items"][0]["error_type"], config["items"][0]["output"]) == (
        False,
        "tools:no_tool_calls",
        "I cannot help with that.",
    )
    assert config["tool_calls"][items[0].id] == []
    # Replayed and paired with a tagged run, each configuration keeps its calls and its schema row.
    paired_json, paired_md = tmp_path / "paired.json", tmp_path / "paired.md"
    argv = ["--from-json", str(out_json), f"{no_calls}:strict", "--compare-to", "full@1"]
    assert main([*argv, "--json", str(paired_json), "--markdown", str(paired_md)]) == 0
    paired = json.loads(paired_json.read_text())
    assert [c["policy"] for c in paired["configs"]] == ["full", "full-strict"]
    assert paired["configs"][0]["tool_calls"] == record["configs"][0]["tool_calls"]
    markdown = paired_md.read_text()
    assert f"| full@1 | 4 | 0 | 1 | {n_calls} | 2 | 2 |" in markdown and "| full-strict@1 | 4 | 1 | 1 |" in markdown
    assert "| full-strict@1 | -25.0 [" in markdown and 'OpenAI tools (tool_choice "required"' in markdown


def test_a_grammar_run_replayed_beside_a_tools_run_says_both_were_asked(stub_server, tmp_path):
    url, _ = stub_server
    common = ["--url", url, "--categories", *CATEGORIES, "--limit", "2"]
    grammar, tools, both = tmp_path / "grammar.json", tmp_path / "tools.json", tmp_path / "both.md"
    assert main([*common, "--json", str(grammar)]) == 0
    assert main([*common, "--api", "tools", "--json", str(tools)]) == 0
    assert main(["--from-json", str(grammar), f"{tools}:tools", "--markdown", str(both)]) == 0
    markdown = both.read_text()
    assert "grammar and OpenAI tools runs side by side" in markdown
    assert "| full-tools@1 | 4 | 0 | 1 |" in markdown and "| full@1 | 4 | 0 | 1 |" not in markdown  # tools runs only


def test_the_tools_path_takes_no_grammar(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["--url", "http://127.0.0.1:9", "--api", "tools", "--grammar", "ebnf", "--limit", "1"])
    assert exit_info.value.code == 2 and "--grammar: --api tools sends no grammar" in capsys.readouterr().err
