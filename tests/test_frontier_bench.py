"""``python -m bench.frontier`` against stub ``/generate`` servers on 127.0.0.1, and one real launcher refusal.

Each stub serves the toy tokenizer (``/model_info``), a four-group pool (``/server_info``) and canned
answers chosen by the item whose chat prompt arrives: BFCL's reference answer or a wrong call, with
``kv_stats`` of known sizes, so accuracy and bytes are known exactly.
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import SimpleNamespace

import pytest

import bench.frontier as frontier
from bench.bfcl import select_items
from bench.frontier import FrontierError, main, start_failure
from sglang_pask.bfcl.oracle import oracle_answer

CATEGORIES = ["simple_python", "multiple"]
BYTES_PER_SLOT = [512, 512, 1024, 1024]
FP8_REFUSAL = "--kv-cache-dtype fp8_e4m3: the layer-group pool does not serve SGLang's quantized KV dtypes"


@dataclass
class Canned:
    """A stub's answers: the (category, index in category) it answers right, the kv_stats of each
    answer (``kept`` and ``lowbit`` per group, ``kept`` None: every token; ``full_tokens`` is 100 + 10 *
    index) and the ones it answers with HTTP 500."""

    correct: set[tuple[str, int]]
    kept: list[int] | None
    lowbit: list[int] | None = None
    fail: set[tuple[str, int]] = field(default_factory=set)

    def stats(self, index: int) -> dict:
        full = 100 + 10 * index
        stats = {"full_tokens": full, "kept_tokens": self.kept or [full] * len(BYTES_PER_SLOT)}
        if self.lowbit is not None:
            stats["lowbit_slots"] = self.lowbit
        return stats


def share(stats: dict) -> float:
    """The bytes formula, written out."""
    lowbit = stats.get("lowbit_slots", [0, 0, 0, 0])
    held = sum((k + s) * b for k, s, b in zip(stats["kept_tokens"], lowbit, BYTES_PER_SLOT))
    return held / (stats["full_tokens"] * sum(BYTES_PER_SLOT))


FULL = Canned({("simple_python", 0), ("simple_python", 1), ("multiple", 0)}, kept=None)
SNAPKV = Canned({("simple_python", 0), ("multiple", 0)}, kept=[25, 30, 20, 10], lowbit=[8, 8, 4, 4])
H2O = Canned({("simple_python", 0)}, kept=[20, 20, 20, 20], fail={("multiple", 1)})
PYRAMIDKV = Canned(set(), kept=[10, 10, 10, 10])


@pytest.fixture(scope="module")
def items():
    return select_items(CATEGORIES, "eval", None, 3)


@pytest.fixture(scope="module")
def ids_file(items, tmp_path_factory):
    path = tmp_path_factory.mktemp("ids") / "ids.txt"
    path.write_text("".join(f"{item.id}\n" for item in items))
    return str(path)


@pytest.fixture(scope="module")
def tokenizer_dir(tok, tmp_path_factory):
    path = tmp_path_factory.mktemp("toy-tokenizer")
    tok.save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def stubs(items, tokenizer_dir):
    """``start(canned)`` -> (url, request bodies seen); every stub stops at the end of the module."""
    from transformers import AutoTokenizer

    from bench.memory import chat_prompt

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    by_prompt = {}
    for item in items:
        index = sum(other.category == item.category for other in items[: items.index(item)])
        by_prompt[chat_prompt(tokenizer, item)] = (item, index)
    servers = []

    def start(canned: Canned):
        seen: list[dict] = []

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def _reply(self, payload: dict, status: int = 200) -> None:
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):
                if self.path == "/model_info":
                    self._reply({"model_path": "stub", "tokenizer_path": str(tokenizer_dir)})
                elif self.path == "/server_info":
                    groups = [{"bytes_per_slot": b} for b in BYTES_PER_SLOT]
                    self._reply({"internal_states": [{"sglang_pask": {"kv_pool": {"groups": groups}}}]})
                else:
                    self._reply({})

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                seen.append(body)
                item, index = by_prompt[body["text"]]
                if (item.category, index) in canned.fail:
                    self._reply({"error": "stub failure"}, status=500)
                    return
                right = (item.category, index) in canned.correct
                meta = {
                    "prompt_tokens": 90 + index,
                    "completion_tokens": 10,
                    "finish_reason": {"type": "stop"},
                    "kv_stats": canned.stats(index),
                }
                self._reply({"text": oracle_answer(item) if right else "[no_such_function(x=1)]", "meta_info": meta})

        server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        return f"http://127.0.0.1:{server.server_address[1]}", seen

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


def _measure(url, label, ids_file, out, *extra):
    return main(["--url", url, "--label", label, "--ids", ids_file, "--json", str(out), *extra])


def test_runs_merge_into_a_frontier_with_differences_best_other_and_refusals(stubs, ids_file, items, tmp_path, capsys):
    full_url, full_seen = stubs(FULL)
    assert _measure(full_url, "full@1", ids_file, tmp_path / "full.json", "--limit", "2", "--max-tokens", "64") == 0
    assert len(full_seen) == 4
    for body in full_seen:
        sampling = body["sampling_params"]
        assert sampling["temperature"] == 0 and sampling["max_new_tokens"] == 64
        assert sampling["ebnf"].startswith('root ::= "["')
    full = json.loads((tmp_path / "full.json").read_text())
    (entry,) = full["configs"]
    assert (entry["method"], entry["point"], entry["status"]) == ("full", 1.0, "measured")
    assert entry["accuracy"] == 75.0  # simple_python 2/2, multiple 1/2
    assert entry["bytes"] == 1.0 and full["complete"] is True
    assert full["command"].startswith("python -m bench.frontier") and full["commit"] and full["machine"]["nproc"]
    assert [i["id"] for i in entry["items"]] == [i.id for i in items if items.index(i) % 3 < 2]

    # snapkv and h2o at 0.25 into one file (the second resumes it), pyramidkv at 0.25 over fewer items.
    part = tmp_path / "part.json"
    snapkv_url, _ = stubs(SNAPKV)
    assert _measure(snapkv_url, "snapkv@0.25", ids_file, part, "--limit", "2", "--max-tokens", "64") == 0
    h2o_url, _ = stubs(H2O)
    assert _measure(h2o_url, "h2o@0.25", ids_file, part, "--limit", "2", "--max-tokens", "64", "--resume") == 0
    pyramid_url, _ = stubs(PYRAMIDKV)
    assert _measure(pyramid_url, "pyramidkv@0.25", ids_file, tmp_path / "pyramid.json", "--limit", "1") == 0
    record = json.loads(part.read_text())
    assert len(record["resumed_from"]) == 1 and "snapkv@0.25" in record["resumed_from"][0]["command"]
    snapkv, h2o = record["configs"]
    expected = [share(SNAPKV.stats(index)) for index in (0, 1, 0, 1)]
    assert [i["bytes"] for i in snapkv["items"]] == pytest.approx(expected)
    assert snapkv["bytes"] == pytest.approx(sum(expected) / 4) and snapkv["accuracy"] == 50.0
    assert snapkv["items"][0]["prompt_tokens"] == 90 and snapkv["items"][0]["completion_tokens"] == 10
    failed = h2o["items"][3]
    assert (failed["valid"], failed["error_type"], failed["bytes"]) == (False, "http_500", None)
    answered = [share(H2O.stats(index)) for index in (0, 1, 0)]  # the failed request has no bytes
    assert h2o["accuracy"] == 25.0 and h2o["bytes"] == pytest.approx(sum(answered) / 3)

    # A refusal from the real launcher: SGLang's fp8 KV (it exits 2 before any model loads).
    refused = tmp_path / "refused.json"
    args = ["--methods", "sglang-fp8", "--ids", ids_file, "--limit", "1", "--json", str(refused)]
    assert main([*args, "--log-dir", str(tmp_path / "logs"), "--server-timeout", "120"]) == 0
    (fp8,) = json.loads(refused.read_text())["configs"]
    assert (fp8["status"], fp8["point"], fp8["items"]) == ("refused", 0.5, [])
    assert fp8["message"].startswith(FP8_REFUSAL)
    assert fp8["flags"][-4:] == ["--kv-policy", "full", "--kv-cache-dtype", "fp8_e4m3"]
    capsys.readouterr()

    md, png = tmp_path / "frontier.md", tmp_path / "frontier.png"
    files = [str(tmp_path / name) for name in ("full.json", "part.json", "pyramid.json", "refused.json")]
    assert main(["--from-json", *files, "--markdown", str(md), "--plot", str(png)]) == 0
    printed = capsys.readouterr().out
    page = md.read_text()
    assert printed.strip() in page
    rows = {line.split(" | ")[1]: line for line in page.splitlines() if line.startswith("| ")}
    assert list(rows)[1:] == ["full", "sglang-fp8", "snapkv", "pyramidkv", "h2o"]  # points down, table order
    cells = [cell.strip() for cell in rows["snapkv"].strip("|").split(" | ")]
    low, high = min(expected), max(expected)
    assert cells[:5] == ["0.25", "snapkv", "4", "50.0", f"{sum(expected) / 4:.3f} ({low:.3f}-{high:.3f})"]
    assert cells[5].startswith("-25.0 [") and cells[5].endswith("]")  # minus full, with its interval
    assert cells[6:9] == ["h2o@0.25", cells[7], "1 : 0 (p = 1)"] and cells[7].startswith("+25.0 [")
    assert cells[9] == "measured bytes 0.040 above h2o@0.25's"  # more than 0.03 apart
    assert (
        " | snapkv@0.25 | -25.0 [" in rows["h2o"]
        and "1 of 4 requests failed, counted incorrect (http_500 x1)" in rows["h2o"]
    )
    # pyramidkv answered 2 of the items: the most accurate other at 0.25 is snapkv, on those 2.
    assert " | snapkv@0.25 | -100.0 [" in rows["pyramidkv"] and "(on 2 common items)" in rows["pyramidkv"]
    assert f"refused: {FP8_REFUSAL}" in rows["sglang-fp8"] and "| 0.5 | sglang-fp8 | - | - |" in rows["sglang-fp8"]
    for name in ("full.json", "part.json", "pyramid.json", "refused.json"):
        assert f"({tmp_path / name})" in page
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 1000

    # A configuration in two files is refused, naming it.
    (tmp_path / "again.json").write_text((tmp_path / "full.json").read_text())
    with pytest.raises(SystemExit) as exit_info:
        main(["--from-json", files[0], str(tmp_path / "again.json")])
    assert exit_info.value.code == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert f"full@1 appears in {files[0]} and in {tmp_path / 'again.json'}" in line


def test_resume_skips_a_finished_configuration(stubs, ids_file, tmp_path, capsys):
    url, seen = stubs(SNAPKV)
    out = tmp_path / "r.json"
    assert _measure(url, "snapkv@0.25", ids_file, out, "--limit", "1") == 0
    assert len(seen) == 2
    assert _measure(url, "snapkv@0.25", ids_file, out, "--limit", "1", "--resume") == 0
    assert len(seen) == 2 and "snapkv@0.25: in " in capsys.readouterr().err
    assert len(json.loads(out.read_text())["configs"]) == 1
    with pytest.raises(SystemExit) as exit_info:
        _measure(url, "snapkv@0.25", ids_file, out, "--limit", "1", "--resume", "--max-tokens", "32")
    assert exit_info.value.code == 2 and "was run with other --max-tokens" in capsys.readouterr().err


def test_an_answer_without_kv_stats_fails_the_run_naming_the_configuration(stubs, ids_file, tmp_path, capsys):
    class NoStats(Canned):
        def stats(self, index: int) -> None:  # the stub sends kv_stats: null
            return None

    url, _ = stubs(NoStats(set(), kept=[]))
    assert main(["--url", url, "--label", "snapkv@0.2", "--ids", ids_file, "--limit", "1"]) == 1
    err = capsys.readouterr().err
    assert "error: snapkv@0.2: the answer to " in err and "has no meta_info.kv_stats" in err


def _fake_server(code, log):
    return SimpleNamespace(process=SimpleNamespace(poll=lambda: code), log_tail=lambda lines=30: log)


def test_a_launcher_refusal_is_told_from_other_start_failures():
    refusal = "Preparing the default model\npython -m sglang_pask.launch_server: error: --kv-bytes 0.15: too low"
    assert (
        start_failure("snapkv-k4v2@0.15", _fake_server(2, refusal), RuntimeError("exited"))
        == "--kv-bytes 0.15: too low"
    )
    for code, log in ((1, refusal), (2, "launch_server.py: error: unrecognized arguments: --x"), (None, "")):
        with pytest.raises(FrontierError, match="the snapkv@0.2 server did not start: exited"):
            start_failure("snapkv@0.2", _fake_server(code, log), RuntimeError("exited"))


def test_servers_get_their_policy_files_and_one_that_dies_at_start_ends_the_run(
    ids_file, tmp_path, monkeypatch, capsys
):
    from sglang_pask.server_process import ServerStartError

    class Exiting:
        """Servers that exit at start: the launcher refusing (status 2), the fourth with status 1."""

        started: list[list[str]] = []

        def __init__(self, flags, log_path, port=None):
            self.started.append(flags)
            code = 1 if len(self.started) == 4 else 2
            self.process = SimpleNamespace(poll=lambda: code)
            self.log = (
                f"python -m sglang_pask.launch_server: error: refusal {len(self.started)}" if code == 2 else "Killed"
            )
            self.url = "http://127.0.0.1:9"

        def wait_ready(self, timeout_s):
            raise ServerStartError(f"server exited with {self.process.poll()}:\n{self.log}")

        def log_tail(self, lines=30):
            return self.log

        def stop(self):
            pass

    monkeypatch.setattr(frontier, "ServerProcess", Exiting)
    tiers, drop = tmp_path / "tiers.json", tmp_path / "drop.json"
    tiers.write_text("{}")
    drop.write_text("{}")
    out = tmp_path / "r.json"
    argv = ["--methods", "pask-drop", "pask-tiers", "--points", "0.2", "0.33", "--server-args", "--dtype bfloat16"]
    argv += ["--tier-policy", f"0.33={tiers}", "--drop-policy", f"0.2={drop}"]
    assert main([*argv, "--ids", ids_file, "--json", str(out), "--log-dir", str(tmp_path)]) == 1
    assert "error: the pask-tiers@0.33 server did not start: server exited with 1" in capsys.readouterr().err
    drop_02, drop_033, tiers_02, tiers_033 = Exiting.started
    common, dtype = list(frontier.COMMON_FLAGS), ["--dtype", "bfloat16"]
    assert drop_02 == [*common, "--kv-policy", "pask", "--kv-decode", "keep", "--kv-bytes", "0.2"] + [
        *("--pask-policy", str(drop), *dtype)
    ]
    assert drop_033 == [*common, "--kv-policy", "pask", "--kv-decode", "keep", "--kv-bytes", "0.33", *dtype]
    lowbit = ["--kv-policy", "pask", "--kv-dropped", "k4v2", "--kv-decode", "lowbit", "--kv-bytes"]
    assert tiers_02 == [*common, *lowbit, "0.2", *dtype]
    assert tiers_033 == [*common, *lowbit, "0.33", "--pask-policy", str(tiers), *dtype]
    record = json.loads(out.read_text())
    assert record["complete"] is False and "pask-tiers@0.33" in record["error"]
    assert [(c["method"], c["point"], c["status"], c["message"]) for c in record["configs"]] == [
        ("pask-drop", 0.2, "refused", "refusal 1"),
        ("pask-drop", 0.33, "refused", "refusal 2"),
        ("pask-tiers", 0.2, "refused", "refusal 3"),
    ]
    assert record["settings"]["policy_files"] == {"pask-tiers": {"0.33": str(tiers)}, "pask-drop": {"0.2": str(drop)}}


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--methods", "snapkv", "nope"], "--methods: unknown method 'nope'"),
        (["--points", "0.2", "1.5"], "--points: 1.5 is outside (0, 1]"),
        (["--points", "0"], "--points: 0 is outside (0, 1]"),
        (["--tier-policy", "0.25"], "--tier-policy: '0.25' is not P=FILE"),
        (["--tier-policy", "x=p.json"], "--tier-policy: 'x=p.json' is not P=FILE"),
        (["--tier-policy", "0.25=/no/such.json"], "no such file: /no/such.json"),
        (["--drop-policy", "0.25"], "--drop-policy: '0.25' is not P=FILE"),
        (
            ["--methods", "snapkv", "--drop-policy", f"0.25={__file__}"],
            "--drop-policy: pask-drop is not among --methods",
        ),
        (["--label", "snapkv@0.25"], "--label names the configuration of a running server: give --url too"),
        (["--url", "http://127.0.0.1:9"], "--url: name the configuration the server runs with --label"),
        (["--url", "http://127.0.0.1:9", "--label", "snapkv"], "--label: 'snapkv' is not METHOD@POINT"),
        (["--url", "http://127.0.0.1:9", "--label", "nope@0.25"], "--label: unknown method 'nope'"),
        (["--url", "http://127.0.0.1:9", "--label", "snapkv@2"], "--label: point 2 is outside (0, 1]"),
        (["--url", "http://127.0.0.1:9", "--label", "snapkv@0.2", "--methods", "h2o"], "--methods: shape the servers"),
        (["--resume"], "--resume keeps the configurations of the --json file: give --json"),
        (["--json", "/no/such/dir/r.json"], "argument --json: cannot write /no/such/dir/r.json"),
        (["--server-args", "--kv-policy snapkv"], "--server-args holds --kv-policy, which the methods set"),
        (["--from-json", "/no/such.json"], "--from-json: file not found: /no/such.json"),
        (["--from-json", "x.json", "--limit", "2"], "--limit: not for --from-json, which runs nothing"),
    ],
)
def test_bad_input_exits_2_with_one_line(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert message in line


@pytest.mark.parametrize("content", ["not json", '{"configs": [{"method": "full"}]}', "[]"])
def test_from_json_refuses_what_is_not_a_frontier_run(content, tmp_path, capsys):
    path = tmp_path / "bad.json"
    path.write_text(content)
    with pytest.raises(SystemExit) as exit_info:
        main(["--from-json", str(path)])
    assert exit_info.value.code == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert str(path) in line


def test_every_method_has_a_doc_line_and_the_grid_runs_fixed_points_once():
    assert all(m.doc and "\n" not in m.doc for m in frontier.METHODS.values())
    grid = frontier.configurations(["full", "sglang-fp8", "snapkv"], [0.1, 0.25])
    assert grid == [("full", 1.0), ("sglang-fp8", 0.5), ("snapkv", 0.1), ("snapkv", 0.25)]
    assert frontier.server_flags("pask-drop", 0.25, "") == [
        *frontier.COMMON_FLAGS,
        *("--kv-policy", "pask", "--kv-decode", "keep", "--kv-bytes", "0.25"),
    ]
    assert frontier.server_flags("full", 1.0, "--dtype bfloat16") == [*frontier.COMMON_FLAGS, "--dtype", "bfloat16"]
    with pytest.raises(ValueError, match="kv_stats has 2 groups"):
        frontier.kv_share({"full_tokens": 10, "kept_tokens": [1, 2]}, BYTES_PER_SLOT)


def test_a_row_names_the_policy_file_its_server_was_given():
    items = [{"id": "simple_python_0", "category": "simple_python", "valid": True, "error_type": "", "bytes": 0.2}]
    flags = [*frontier.COMMON_FLAGS, "--kv-policy", "pask", "--pask-policy", "tiers-0.15.json"]
    entry = frontier.measured_entry("pask-tiers", 0.15, flags, items, 1.0, {})
    (row,) = frontier.report_rows([entry])
    assert frontier.format_table([row]).splitlines()[-1].endswith("| --pask-policy tiers-0.15.json |")
