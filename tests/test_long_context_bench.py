"""``bench/long_context.py``: the generated prompts, the streamed answer with its StructKV report, and the
summary (accuracy, TTFT ratios, median pivot) and prompt-by-prompt comparison on outcomes written by hand."""

from __future__ import annotations

import json
import re
import threading
from dataclasses import asdict
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from transformers import AutoTokenizer

from bench.common import exact_mcnemar_p
from bench.long_context import (
    NOISE,
    Item,
    Outcome,
    ServerLost,
    ask,
    build_items,
    build_parser,
    essay_sentences,
    format_paired,
    format_table,
    is_correct,
    outcome,
    paired_comparisons,
    server_flags,
    summarize,
)
from sglang_pask.default_model import ensure_default_model
from sglang_pask.server_process import free_port


def test_items_fit_their_length_and_hold_what_the_answer_must_name():
    tokenizer = AutoTokenizer.from_pretrained(ensure_default_model())
    items = build_items(tokenizer, ["niah", "vt"], [512, 1024], 2)
    assert [(i.task, i.length, i.index) for i in items] == [
        ("niah", 512, 0),
        ("niah", 512, 1),
        ("niah", 1024, 0),
        ("niah", 1024, 1),
        ("vt", 512, 0),
        ("vt", 512, 1),
        ("vt", 1024, 0),
        ("vt", 1024, 1),
    ]
    for item in items:
        tokens = len(tokenizer(item.text)["input_ids"])
        assert 0.8 * item.length <= tokens <= item.length
        assert all(part in item.text for part in item.expected)
    assert build_items(tokenizer, ["niah"], [512], 1)[0] == items[0]  # seeded: the same prompt every run
    later = build_items(tokenizer, ["niah"], [512], 2, first=1)  # seeded by index: --first-item K continues a run
    assert [i.index for i in later] == [1, 2] and later[0] == items[1] and later[1].text != items[1].text


def test_essay_tasks_hide_four_needles_in_essay_text():
    tokenizer = AutoTokenizer.from_pretrained(ensure_default_model())
    items = build_items(tokenizer, ["niah-mk", "niah-mv"], [1024], 3)
    assert len(essay_sentences()) > 5000
    for item in items:
        tokens = len(tokenizer(item.text)["input_ids"])
        assert 0.8 * item.length <= tokens <= item.length
        assert NOISE not in item.text
        needles = re.findall(r"One of the special magic numbers for ([a-z-]+) is: (\d{7})\.", item.text)
        assert len(needles) == 4 and len({value for _, value in needles}) == 4
        keys = {key for key, _ in needles}
        question = item.text.rsplit("\n\n", 1)[1]
        if item.task == "niah-mk":  # one asked for, three distractors with other keys
            assert len(keys) == 4 and len(item.expected) == 1
            assert dict(needles)[re.search(r"number for ([a-z-]+) ", question).group(1)] == item.expected[0]
        else:  # one key, every value asked for
            assert len(keys) == 1 and sorted(item.expected) == sorted(value for _, value in needles)
    assert len({item.text[:300] for item in items}) == len(items)  # each item starts elsewhere in the essays


def test_an_answer_is_correct_only_if_it_names_every_expected_part():
    item = Item("vt", 512, 0, "text", ("AAAAA", "BBBBB"))
    assert is_correct(item, "AAAAA BBBBB")
    assert not is_correct(item, "AAAAA")


@pytest.fixture()
def streaming_stub():
    """A /generate stub that streams two chunks; the last carries a StructKV report."""
    report = {"mode": "auto", "pivot": 9, "decided_at": 11, "skeleton_tokens": 120}

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def do_POST(self):
            self.rfile.read(int(self.headers["Content-Length"]))
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.end_headers()
            for chunk in (
                {"text": "The number", "meta_info": {}},
                {"text": "The number is 1234567.", "meta_info": {"kv_stats": {"structkv": report}}},
            ):
                self.wfile.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
            self.wfile.write(b"data: [DONE]\n\n")

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}", report
    server.shutdown()


def test_ask_returns_the_answer_its_first_chunk_time_and_the_structkv_report(streaming_stub):
    url, report = streaming_stub
    text, ttft, got = ask(url, Item("niah", 512, 0, "prompt", ("1234567",)))
    assert text == "The number is 1234567." and ttft > 0 and got == report


def test_a_server_that_stops_answering_is_named_with_the_end_of_its_log():
    class DeadServer:
        url = f"http://127.0.0.1:{free_port()}"  # nothing listens there

        @staticmethod
        def log_tail(lines: int = 30) -> str:
            return "last line of the snapkv log"

    with pytest.raises(ServerLost) as raised:
        outcome("snapkv", Item("niah", 512, 0, "prompt", ("1234567",)), DeadServer())
    message = str(raised.value)
    assert "the snapkv server stopped answering" in message
    assert "last line of the snapkv log" in message and "--max-total-tokens" in message


def test_summary_compares_with_full_only_on_the_prompts_full_kv_answered_too():
    outcomes = [
        Outcome("full", "vt", 8192, 0, True, 10.0, "a"),
        Outcome("full", "vt", 8192, 1, False, 12.0, "b"),
        Outcome("structkv", "vt", 8192, 0, True, 5.0, "a"),
        Outcome("structkv", "vt", 8192, 1, True, 6.0, "c"),
        Outcome("structkv", "vt", 8192, 7, True, 1.0, "d"),  # a prompt full KV never saw (a pooled run)
        Outcome("structkv", "vt", 8192, 8, True, 1.0, "e"),
    ]
    structkv = summarize(outcomes)[1]
    assert structkv["items"] == 4 and structkv["accuracy"] == 1.0
    assert structkv["accuracy_vs_full"] == 2.0  # 2 of the shared prompts against full KV's 1, not 1.0 / 0.5
    assert structkv["ttft_vs_full"] == pytest.approx(5.5 / 11.0)
    only = summarize([o for o in outcomes if o.index >= 7] + outcomes[:1])[1]
    assert only.get("accuracy_vs_full") is None and only.get("ttft_vs_full") is None  # nothing shared with full KV


def test_summary_compares_with_full_and_gives_the_median_pivot():
    outcomes = [
        Outcome("full", "niah", 2048, 0, True, 2.0, "a"),
        Outcome("full", "vt", 2048, 0, True, 4.0, "b"),
        Outcome("structkv", "niah", 2048, 0, True, 1.0, "a", pivot=8, decided_at=10, skeleton_tokens=400),
        Outcome("structkv", "vt", 2048, 0, False, 1.5, "c", pivot=12, decided_at=14, skeleton_tokens=400),
    ]
    rows = summarize(outcomes)
    full, structkv = rows
    assert (full["mode"], full["accuracy"], full["ttft_s"], full["pivot"]) == ("full", 1.0, 3.0, None)
    assert structkv["accuracy"] == 0.5 and structkv["accuracy_vs_full"] == 0.5
    assert structkv["ttft_vs_full"] == pytest.approx(1.25 / 3.0)
    assert (structkv["pivot"], structkv["decided_at"]) == (10, 12)
    table = format_table(rows, markdown=True)
    assert "| pivot | pruned after |" in table and "| 10.0 | 12.0 |" in table
    assert "| acc | acc niah | acc vt | acc/full |" in table  # a column for each task run, only those


@pytest.mark.parametrize("bad", ["0", "-3", "eleven", ""])
def test_a_bad_structkv_pivot_is_refused_before_any_server_starts(bad, capsys):
    with pytest.raises(SystemExit) as exit_info:
        build_parser().parse_args(["--structkv-pivot", bad])
    assert exit_info.value.code == 2
    assert "--structkv-pivot: must be 'auto' or a layer index >= 1" in capsys.readouterr().err
    assert build_parser().parse_args(["--structkv-pivot", "13"]).structkv_pivot == "13"


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--items", "0"], "--items: '0' is below 1"),
        (["--items", "two"], "--items: 'two' is not an integer"),
        (["--first-item", "-1"], "--first-item: '-1' is below 0"),
    ],
)
def test_bad_item_counts_are_refused_before_any_server_starts(flags, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        build_parser().parse_args(flags)
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err
    assert build_parser().parse_args(["--items", "3", "--first-item", "5"]).first_item == 5


def test_a_run_whose_server_dies_still_writes_what_it_measured(tmp_path, monkeypatch, capsys):
    import bench.long_context as long_context

    def full_then_lost(mode, model_path, items, args, log_dir, outcomes):
        if mode != "full":
            raise ServerLost(f"the {mode} server stopped answering (ConnectionError); its log ended:\nkilled")
        outcomes.append(Outcome("full", items[0].task, items[0].length, 0, True, 2.0, "answer"))

    monkeypatch.setattr(long_context, "run_mode", full_then_lost)
    json_path, markdown_path = tmp_path / "run.json", tmp_path / "run.md"
    code = long_context.main(
        [
            "--model-path",
            str(ensure_default_model()),
            "--modes",
            "full",
            "snapkv",
            "--tasks",
            "niah",
            "--lengths",
            "512",
            "--items",
            "1",
            "--json",
            str(json_path),
            "--markdown",
            str(markdown_path),
        ]
    )
    assert code == 1
    assert "error: the snapkv server stopped answering" in capsys.readouterr().err
    record = json.loads(json_path.read_text())
    assert record["complete"] is False and "snapkv server stopped answering" in record["error"]
    assert [(r["mode"], r["correct"]) for r in record["results"]] == [("full", True)]
    markdown = markdown_path.read_text()
    assert "**Incomplete**: the run ended early: the snapkv server stopped answering" in markdown
    assert "| 512 | full | 1 |" in markdown


@pytest.mark.parametrize(
    "only_first, only_second, p",
    [(0, 0, 1.0), (4, 0, 0.125), (0, 5, 0.0625), (6, 0, 0.03125), (3, 1, 0.625), (7, 3, 0.34375), (5, 5, 1.0)],
)
def test_exact_mcnemar_is_the_two_sided_sign_test_on_the_disagreements(only_first, only_second, p):
    assert exact_mcnemar_p(only_first, only_second) == pytest.approx(p)


def test_exact_mcnemar_refuses_negative_counts():
    with pytest.raises(ValueError, match="counts must be >= 0"):
        exact_mcnemar_p(-1, 2)


def test_paired_comparisons_count_the_prompts_only_one_mode_answered_right():
    right = {  # (mode, length): verdicts on prompts 0..5 of one task
        ("full", 2048): [1, 1, 1, 1, 0, 0],
        ("structkv", 2048): [1, 1, 0, 1, 1, 0],
        ("fixed-pivot", 2048): [1, 0, 0, 0, 0, 0],
        ("full", 4096): [1, 1, 1, 1, 1, 1],
        ("structkv", 4096): [1, 1, 1, 1, 1, 1],
        ("fixed-pivot", 4096): [1, 1, 1, 1, 1],
    }
    outcomes = [
        Outcome(mode, "niah", length, i, bool(v), 1.0, "")
        for (mode, length), verdicts in right.items()
        for i, v in enumerate(verdicts)
    ]
    outcomes.append(Outcome("snapkv", "niah", 8192, 0, True, 1.0, ""))  # no full KV at 8K: nothing to pair it with
    rows = {(r["length"], r["mode"], r["reference"]): r for r in paired_comparisons(outcomes)}
    assert set(rows) == {
        (n, m, ref)
        for n in (2048, 4096, "all")
        for m, ref in (("structkv", "full"), ("fixed-pivot", "full"), ("structkv", "fixed-pivot"))
    }
    first = rows[(2048, "structkv", "full")]
    assert (first["prompts"], first["only_mode"], first["only_reference"]) == (6, 1, 1) and first["p"] == 1.0
    # The fixed pivot answered five 4K prompts: only those are paired.
    assert rows[(4096, "fixed-pivot", "full")]["prompts"] == 5
    pooled = rows[("all", "structkv", "fixed-pivot")]
    assert (pooled["prompts"], pooled["only_mode"], pooled["only_reference"]) == (11, 3, 0)
    assert pooled["p"] == pytest.approx(0.25)
    table = format_paired(list(rows.values()), markdown=True).splitlines()
    assert table[0] == "| length | mode | against | prompts | only mode right | only against right | exact McNemar p |"
    assert "| all | structkv | fixed-pivot | 11 | 3 | 0 | 0.250 |" in table


def test_a_run_writes_the_prompt_by_prompt_comparison(tmp_path, monkeypatch, capsys):
    import bench.long_context as long_context

    def answer(mode, model_path, items, args, log_dir, outcomes):
        outcomes.extend(
            Outcome(mode, item.task, item.length, item.index, mode == "full" or item.index == 0, 1.0, "")
            for item in items
        )

    monkeypatch.setattr(long_context, "run_mode", answer)
    json_path, markdown_path = tmp_path / "run.json", tmp_path / "run.md"
    assert (
        long_context.main(
            [
                "--model-path",
                str(ensure_default_model()),
                "--modes",
                "full",
                "structkv",
                "--tasks",
                "niah",
                "--lengths",
                "512",
                "--items",
                "3",
                "--json",
                str(json_path),
                "--markdown",
                str(markdown_path),
            ]
        )
        == 0
    )
    assert "only mode right" in capsys.readouterr().out
    assert "| 512 | structkv | full | 3 | 0 | 2 | 0.500 |" in markdown_path.read_text()
    (paired,) = json.loads(json_path.read_text())["paired"]
    assert (paired["mode"], paired["reference"], paired["only_reference"]) == ("structkv", "full", 2)


def _run_file(path, outcomes, commit):
    path.write_text(
        json.dumps(
            {
                "command": "python -m bench.long_context ...",
                "commit": commit,
                "date": "2026-12-04T00:00:00+00:00",
                "model": "m",
                "results": [asdict(o) for o in outcomes],
            }
        )
    )
    return str(path)


def test_from_json_pools_runs_counts_each_answer_once_and_leaves_pooled_times_out(tmp_path, capsys):
    from bench.long_context import main

    first = _run_file(
        tmp_path / "a.json",
        [Outcome("full", "niah", 2048, 0, True, 2.0, "a"), Outcome("structkv", "niah", 2048, 0, False, 1.0, "b")],
        "c1",
    )
    second = _run_file(
        tmp_path / "b.json",
        [
            Outcome("full", "niah", 2048, 0, False, 9.0, "x"),  # a repeat: left out
            Outcome("full", "niah", 2048, 1, True, 4.0, "c"),
            Outcome("structkv", "niah", 2048, 1, True, 2.0, "c"),
        ],
        "c2",
    )
    markdown, record_path, png = tmp_path / "pooled.md", tmp_path / "pooled.json", tmp_path / "pooled.png"
    assert (
        main(
            ["--from-json", first, second, "--markdown", str(markdown), "--json", str(record_path), "--plot", str(png)]
        )
        == 0
    )
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    captured = capsys.readouterr()
    assert "1 answer(s) given again by a later file left out" in captured.err
    record = json.loads(record_path.read_text())
    rows = {r["mode"]: r for r in record["summary"]}
    assert rows["full"]["items"] == 2 and rows["full"]["accuracy"] == 1.0  # the first file's verdict on prompt 0
    assert rows["structkv"]["accuracy"] == 0.5 and rows["structkv"]["ttft_s"] is None
    assert rows["structkv"]["ttft_vs_full"] is None  # times of two runs are not comparable
    assert [s["commit"] for s in record["sources"]] == ["c1", "c2"]
    text = markdown.read_text()
    assert f"- pooled from `{first}` (commit c1" in text and "| 2048 | structkv | 2 | 0.50 |" in text

    assert (
        main(["--from-json", second, "--json", str(record_path), "--plot", str(png)]) == 0
    )  # one run: its times stand
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    rows = {r["mode"]: r for r in json.loads(record_path.read_text())["summary"]}
    assert rows["structkv"]["ttft_vs_full"] == pytest.approx(2.0 / 4.0)  # against full KV on the same prompt


@pytest.mark.parametrize(
    "content, message",
    [
        ('{"table": "x"}', "file 1 has no 'results' list"),
        ('{"results": [{"mode": "full"}]}', "file 1: an entry is not a long-context answer"),
        ('{"results": []}', "the files hold no answers"),
        (
            '{"results": [{"mode": "lossy", "task": "niah", "length": 2048, "index": 0, "correct": true, "ttft_s": 1.0, '
            '"answer": ""}]}',
            "unknown mode or task ('lossy', 'niah')",
        ),
        (
            '{"results": [{"mode": "full", "task": "niah", "length": 2048, "index": 0, "correct": "yes", "ttft_s": 1.0, '
            '"answer": ""}]}',
            "a field of the wrong type",
        ),
    ],
)
def test_from_json_refuses_what_is_not_a_run_file(content, message, tmp_path, capsys):
    from bench.long_context import main

    path = tmp_path / "run.json"
    path.write_text(content)
    with pytest.raises(SystemExit) as exit_info:
        main(["--from-json", str(path)])
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize(
    "flags, named",
    [
        (["--items", "3"], "--items"),
        (["--modes", "full", "--interleave"], "--modes, --interleave"),
        (["--server-args", "--max-total-tokens 8192"], "--server-args"),
    ],
)
def test_from_json_refuses_flags_that_only_shape_a_live_run(flags, named, tmp_path, capsys):
    from bench.long_context import main

    with pytest.raises(SystemExit) as exit_info:
        main(["--from-json", str(tmp_path / "never_read.json"), *flags])
    assert exit_info.value.code == 2
    assert f"error: {named}: only shape a live run; --from-json starts no server" in capsys.readouterr().err


def test_every_flag_is_either_a_live_run_flag_or_meaningful_in_a_replay():
    from bench.long_context import LIVE_RUN_FLAGS, build_parser

    dests = {a.dest for a in build_parser()._actions} - {"help"}
    assert set(LIVE_RUN_FLAGS) <= dests
    assert dests - set(LIVE_RUN_FLAGS) == {"from_json", "json", "markdown", "plot"}


def test_centrality_ranked_kv_is_paired_with_structkv_and_full():
    outcomes = [
        Outcome(mode, "niah-mv", 2048, i, bool(v), 1.0, "")
        for mode, verdicts in (
            ("full", [1, 1, 1, 0]),
            ("structkv", [0, 0, 1, 0]),
            ("structkv-central-kv", [1, 1, 1, 1]),
        )
        for i, v in enumerate(verdicts)
    ]
    rows = {(r["mode"], r["reference"]): r for r in paired_comparisons(outcomes)}
    assert set(rows) == {("structkv", "full"), ("structkv-central-kv", "full"), ("structkv-central-kv", "structkv")}
    against_own = rows[("structkv-central-kv", "structkv")]
    assert (against_own["only_mode"], against_own["only_reference"]) == (3, 0)
    assert server_flags("structkv-central-kv", 11, 9)[-2:] == ["--structkv-kv-score", "centrality"]
