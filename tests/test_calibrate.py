"""``python -m sglang_pask.calibrate``: the floor and share rules, a run on the tiny model, and SIGTERM."""

from __future__ import annotations

import dataclasses
import json
import re
import signal
import subprocess
import sys
from types import SimpleNamespace

import psutil
import pytest

from sglang_pask.calibrate import (
    balance_by_category,
    floors_from_sensitivity,
    policy_table,
    scale_to_total,
    shares_from_distortion,
    spread_joint_sensitivity,
)
from sglang_pask.policy import load_policy_file
from sglang_pask.policy.pask import NUM_ROLES
from sglang_pask.policy.pask_file import table_to_json
from sglang_pask.structure.roles import LABELS


def calibrate(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "sglang_pask.calibrate", *args], capture_output=True, text=True, timeout=900
    )


def measured_policy(tmp_path, model_name: str = "m") -> tuple:
    """A policy file as a calibration writes it, on made-up measurements over two groups of 2 layers.

    Under compress, the answer's func_name (scarce and very sensitive) is a tenth of the tokens;
    under keep, it is no token of the prompt at all.
    """
    joint = {"func_name": 0.5, "user_question": 0.5, "system_text": 0.25, "boundary": 0.25}
    per_group = {
        "0:func_name": 0.5,
        "1:func_name": 0.0,
        "0:user_question": 0.0,
        "1:user_question": 0.5,
        "0:system_text": 0.25,
        "1:system_text": 0.0,
        "0:boundary": 0.0,
        "1:boundary": 0.25,
    }
    compress = {"func_name": 0.1, "user_question": 0.1, "system_text": 0.4, "boundary": 0.4}
    keep = {"user_question": 0.1, "system_text": 0.45, "boundary": 0.45}
    frequencies = [compress.get(label, 0.0) for label in LABELS]
    per_group_rows = [[per_group.get(f"{g}:{label}", 0.0) for label in LABELS] for g in range(2)]
    joint_row = [joint.get(label, 0.0) for label in LABELS]
    table = policy_table(per_group_rows, joint_row, [0.2, 0.1], [2, 2], frequencies, 0.5, 0.6)
    calibration = {
        "command": "calibrate",
        "date": "2026-12-01",
        "items": ["simple_python_1"],
        "budget": 0.5,
        "kv_decode": "compress",
        "error_rate_dropped_everywhere": joint,
        "error_rate_dropped": per_group,
        "distortion": [0.2, 0.1],
        "role_frequencies_by_decode_mode": {"compress": compress, "keep": keep},
    }
    path = tmp_path / "source.json"
    path.write_text(json.dumps(table_to_json(table, model_name, [range(0, 2), range(2, 4)], calibration)))
    model = tmp_path / model_name
    model.mkdir(exist_ok=True)
    return path, model, per_group_rows, joint_row, [keep.get(label, 0.0) for label in LABELS]


def test_floors_protect_the_most_sensitive_roles_per_token_within_the_limit():
    frequencies = [0.1, 0.05, 0.8, 0.05]
    sensitivity = [[0.0, 0.2, 0.1, 0.1], [0.4, 0.0, 0.0, 0.0]]
    floors = floors_from_sensitivity(sensitivity, frequencies, [0.5, 0.5], max_protected_share=0.6)
    # Group 0 has room for 0.3 of the tokens: role 1 (0.2 per 0.05 tokens) first, then role 3;
    # role 2 (0.1 per 0.8 tokens) gets what is left, 0.2 of 0.8. Harmless role 0 gets no floor.
    assert floors[0] == pytest.approx([0.0, 1.0, 0.25, 1.0])
    assert sum(f * p for f, p in zip(floors[0], frequencies)) == pytest.approx(0.3)
    assert floors[1] == [1.0, 0.0, 0.0, 0.0]
    # A role too large for the room gets the floor that fills it exactly; the rest none.
    tight = floors_from_sensitivity([[0.4, 0.3, 0.2]], [0.3, 0.3, 0.4], [0.2], max_protected_share=0.5)
    assert tight == [[pytest.approx(1 / 3), 0.0, 0.0]]
    assert floors_from_sensitivity([[0.0, 0.0]], [0.5, 0.5], [0.3]) == [[0.0, 0.0]]


def test_every_group_carries_at_least_an_even_share_of_the_joint_sensitivity():
    per_group = [[0.0, 0.5, 0.0], [0.0, 0.0, 0.0]]
    assert spread_joint_sensitivity(per_group, [0.4, 0.5, 0.0]) == [[0.2, 0.5, 0.0], [0.2, 0.25, 0.0]]


def test_shares_follow_layer_weighted_distortion():
    assert shares_from_distortion([0.2, 0.6], [2, 2]) == pytest.approx([0.25, 0.75])
    assert shares_from_distortion([0.0, 0.0], [1, 3]) == [0.25, 0.75]


def test_sensitivity_items_balanced_by_category_keep_order_and_spread():
    items = [
        SimpleNamespace(id=f"{category}_{i}", category=category)
        for category, count in (("simple", 6), ("parallel_multiple", 1), ("multiple", 4))
        for i in range(count)
    ]
    chosen = [item.id for item in balance_by_category(items, 2)]
    assert chosen == ["simple_0", "simple_3", "parallel_multiple_0", "multiple_0", "multiple_2"]
    assert balance_by_category(items, None) == items
    assert balance_by_category(items, 10) == items


def test_bad_arguments_exit_2():
    for args in (
        ["--budget", "1.5"],
        ["--limit", "0"],
        ["--sensitivity-per-category", "0"],
        ["--kv-layer-groups", "3-1"],
        ["--max-protected-share", "0"],
        ["--sinks", "-1"],
        ["--out", "/no/such/directory/policy.json"],
    ):  # refused before a 40-minute run, not after
        run = subprocess.run(
            [sys.executable, "-m", "sglang_pask.calibrate", *args], capture_output=True, text=True, timeout=120
        )
        assert run.returncode == 2 and "error" in run.stderr
    assert "cannot write /no/such/directory/policy.json: directory /no/such/directory does not exist" in run.stderr


def test_refit_for_keep_fits_the_floors_to_the_prompts_roles(tmp_path):
    source, model, per_group, joint, keep = measured_policy(tmp_path)
    out = tmp_path / "keep.json"
    run = calibrate(
        "--refit", str(source), "--model-path", str(model), "--kv-decode", "keep", "--budget", "0.4", "--out", str(out)
    )
    assert run.returncode == 0, run.stderr
    data = json.loads(out.read_text())
    expected = policy_table(per_group, joint, [0.2, 0.1], [2, 2], keep, 0.4, 0.6)
    assert data["floors"] == [list(row) for row in expected.floors]
    assert data["role_frequencies"] == dict(zip(LABELS, keep))
    # Under keep the answer's roles cost nothing: func_name protected without taking room. Under
    # compress the same measurements give the prompt's user_question less room in group 0.
    compress = json.loads(source.read_text())
    func, question = LABELS.index("func_name"), LABELS.index("user_question")
    assert data["floors"][0][func] == 1.0
    assert sum(f * p for f, p in zip(data["floors"][0], keep)) == pytest.approx(0.6 * expected.group_budgets(0.4)[0])
    assert data["floors"] != compress["floors"]
    calibration = data["calibration"]
    assert calibration["kv_decode"] == "keep" and calibration["budget"] == 0.4
    assert calibration["distortion_budget"] == 0.5 and calibration["refit_of"]["file"] == str(source)
    assert calibration["error_rate_dropped"] == compress["calibration"]["error_rate_dropped"]
    table = load_policy_file(out, 4, [range(0, 2), range(2, 4)], "m")
    assert table.floors[1][question] == 1.0 and table.sinks == 0 and "sinks" not in data
    # --sinks writes the sinks and changes nothing else.
    with_sinks = tmp_path / "keep_sinks.json"
    run = calibrate(
        "--refit",
        str(source),
        "--model-path",
        str(model),
        "--kv-decode",
        "keep",
        "--budget",
        "0.4",
        "--sinks",
        "4",
        "--out",
        str(with_sinks),
    )
    assert run.returncode == 0, run.stderr
    assert load_policy_file(with_sinks, 4, [range(0, 2), range(2, 4)], "m") == dataclasses.replace(table, sinks=4)


def test_refit_refuses_another_grammar_than_its_measurements(tmp_path):
    source, model, _, _, _ = measured_policy(tmp_path)  # written without "grammar": the loose ebnf
    out = tmp_path / "strict.json"
    run = calibrate(
        "--refit",
        str(source),
        "--model-path",
        str(model),
        "--kv-decode",
        "keep",
        "--budget",
        "0.4",
        "--grammar",
        "ebnf-strict",
        "--out",
        str(out),
    )
    assert run.returncode == 2 and not out.exists()
    assert "taken under --grammar ebnf; a refit cannot change the grammar" in run.stderr
    same = calibrate(
        "--refit",
        str(source),
        "--model-path",
        str(model),
        "--kv-decode",
        "keep",
        "--budget",
        "0.4",
        "--grammar",
        "ebnf",
        "--out",
        str(out),
    )
    assert same.returncode == 0, same.stderr


def test_refit_of_a_file_older_than_a_refined_role_counts_it_as_the_role_it_refines(tmp_path):
    source, model, *_ = measured_policy(tmp_path)
    data = json.loads(source.read_text())
    data["calibration"]["error_rate_dropped_everywhere"]["schema_description"] = 0.5
    data["calibration"]["error_rate_dropped"].update({"0:schema_description": 0.5, "1:schema_description": 0.0})
    # Written before schema_example existed; its tokens then were schema_description's (0.1 + 0.05).
    data["calibration"]["role_frequencies_by_decode_mode"]["keep"] = {
        "user_question": 0.1,
        "system_text": 0.375,
        "boundary": 0.375,
        "schema_description": 0.1,
        "schema_example": 0.05,
    }
    column = data["roles"].index("schema_example")
    del data["roles"][column]
    for row in data["floors"]:
        del row[column]
    old = tmp_path / "old.json"
    old.write_text(json.dumps(data))
    out = tmp_path / "keep.json"
    run = calibrate(
        "--refit", str(old), "--model-path", str(model), "--kv-decode", "keep", "--budget", "0.4", "--out", str(out)
    )
    assert run.returncode == 0, run.stderr
    refit = json.loads(out.read_text())
    description, example = LABELS.index("schema_description"), LABELS.index("schema_example")
    assert refit["role_frequencies"]["schema_example"] == 0.0
    assert refit["role_frequencies"]["schema_description"] == pytest.approx(0.15)
    assert [row[example] for row in refit["floors"]] == [row[description] for row in refit["floors"]]
    assert refit["floors"][0][description] > 0


def test_refit_refuses_what_its_source_cannot_give(tmp_path):
    source, model, *_ = measured_policy(tmp_path)
    data = json.loads(source.read_text())
    data["calibration"]["kv_decode"] = "keep"
    del data["calibration"]["role_frequencies_by_decode_mode"]["compress"]
    keep_only = tmp_path / "keep_only.json"
    keep_only.write_text(json.dumps(data))
    del data["calibration"]["role_frequencies_by_decode_mode"]["keep"]
    data["calibration"]["kv_decode"] = "compress"
    data["calibration"]["items"] = ["no_such_item"]
    unknown_items = tmp_path / "unknown_items.json"
    unknown_items.write_text(json.dumps(data))
    broken = tmp_path / "broken.json"
    broken.write_text('{"calibration": {}}')
    other = tmp_path / "other-model"
    other.mkdir()
    for args, message in (
        (["--refit", str(keep_only), "--model-path", str(model), "--kv-decode", "compress"], "cannot be refitted"),
        (["--refit", str(broken), "--model-path", str(model)], "not a calibrated policy file"),
        (
            ["--refit", str(unknown_items), "--model-path", str(model), "--kv-decode", "keep"],
            "items ['no_such_item'] are not in the BFCL data",
        ),
        (["--refit", str(tmp_path / "absent.json"), "--model-path", str(model)], "cannot read it"),
        (["--refit", str(source), "--model-path", str(other)], "calibrated for model 'm'"),
        (
            ["--refit", str(source), "--model-path", str(model), "--sensitivity-per-category", "3", "--limit", "4"],
            "so --limit, --sensitivity-per-category would have no effect",
        ),
        (
            ["--refit", str(source), "--model-path", str(model), "--kv-bytes", "0.2"],
            "it has no low-bit measurements, so it cannot be solved for --kv-bytes",
        ),
    ):
        run = calibrate(*args, "--out", str(tmp_path / "out.json"))
        assert run.returncode == 2 and message in run.stderr, (args, run.stderr)
        assert len(run.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "out.json").exists()


@pytest.mark.server
def test_calibration_on_the_tiny_model_writes_a_loadable_policy(tiny_model_dir, tmp_path):
    out = tmp_path / "policy.json"
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "sglang_pask.calibrate",
            "--model-path",
            str(tiny_model_dir),
            "--out",
            str(out),
            "--kv-layer-groups",
            "0-0,1-1",
            "--limit",
            "2",
            "--max-tokens",
            "12",
            "--min-role-share",
            "0.05",
            "--budget",
            "0.5",
            "--grammar",
            "ebnf-strict",
            "--kv-dropped",
            "k4v2",
        ],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    data = json.loads(out.read_text())
    assert data["calibration"]["grammar"] == "ebnf-strict"
    # --kv-dropped k4v2 also probed every role kept as its k4v2 round trip (the low-bit tier).
    assert data["calibration"]["lowbit_format"] == "k4v2"
    assert set(data["calibration"]["error_rate_lowbit_everywhere"]) == set(data["calibration"]["probed_roles"])
    assert 0 <= data["calibration"]["error_rate_lowbit_all_roles"] <= 1  # every token at k4v2 at once
    # --reuse takes every rate the file measured and measures only the every-token probe again.
    again = tmp_path / "again.json"
    run = calibrate(
        *("--model-path", str(tiny_model_dir), "--out", str(again), "--kv-layer-groups", "0-0,1-1", "--limit", "2"),
        *("--max-tokens", "12", "--min-role-share", "0.05", "--budget", "0.5", "--grammar", "ebnf-strict"),
        *("--kv-dropped", "k4v2", "--reuse", str(out)),
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert "k4v2 on every token" in run.stderr and "screening" not in run.stderr and "sensitivity (" not in run.stderr
    redone = json.loads(again.read_text())["calibration"]
    for key in ("error_rate_dropped", "error_rate_lowbit", "error_rate_lowbit_everywhere", "sensitivity_items"):
        assert redone[key] == data["calibration"][key], key
    assert redone["reused_from"]["file"] == str(out)
    assert redone["reused_from"]["reused"] == ["dropped", "lowbit k4v2 per role"]
    assert "lowbit" not in data  # no --kv-bytes: an untiered table
    assert data["format"] == "sglang-pask-policy" and data["model"]["name"] == tiny_model_dir.name
    calibration = data["calibration"]
    assert len(calibration["items"]) == 2 and len(calibration["distortion"]) == 2
    assert all(d > 0 for d in calibration["distortion"])
    assert set(calibration["error_rate_dropped_everywhere"]) == set(calibration["probed_roles"])
    assert all(0 <= rate <= 1 for rate in calibration["error_rate_dropped_everywhere"].values())
    assert len(calibration["sensitivity_items"]) >= 1
    table = load_policy_file(out, 2, [range(0, 1), range(1, 2)], tiny_model_dir.name)
    assert len(table.floors) == 2 and all(len(row) == NUM_ROLES for row in table.floors)
    assert abs(sum(table.residual_shares) - 1) < 1e-9
    # A refit for keep without the recorded prompt shares tags the prompts offline: the server's
    # tags (recorded by the calibration) and the offline ones agree exactly.
    recorded = calibration.pop("role_frequencies_by_decode_mode")
    assert recorded["keep"]["template"] > 0 and recorded["keep"]["func_name"] == 0
    out.write_text(json.dumps(data))
    refitted = tmp_path / "keep.json"
    run = calibrate(
        "--refit",
        str(out),
        "--model-path",
        str(tiny_model_dir),
        "--kv-decode",
        "keep",
        "--budget",
        "0.5",
        "--out",
        str(refitted),
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert json.loads(refitted.read_text())["role_frequencies"] == pytest.approx(recorded["keep"])
    # The same measurements solved for a byte share: a tiered file the server can load.
    tiered = tmp_path / "tiers.json"
    run = calibrate(
        "--refit",
        str(refitted),
        "--model-path",
        str(tiny_model_dir),
        "--kv-decode",
        "keep",
        "--kv-bytes",
        "0.3",
        "--out",
        str(tiered),
    )
    assert run.returncode == 0, run.stderr[-3000:]
    tiers = json.loads(tiered.read_text())
    assert tiers["lowbit_format"] == "k4v2" and tiers["kv_bytes"] == 0.3
    assert tiers["calibration"]["tier_predicted_bytes"] <= 0.3 + 1e-9
    table = load_policy_file(tiered, 2, [range(0, 1), range(1, 2)], tiny_model_dir.name, "keep", "k4v2")
    assert table.lowbit is not None
    assert all(f + q in (0.0, 1.0) for fr, qr in zip(table.floors, table.lowbit) for f, q in zip(fr, qr))


@pytest.mark.server
def test_sigterm_mid_stage_stops_the_calibration_and_its_server_without_sending_the_queued_probes(
    tiny_model_dir, tmp_path
):
    model = tmp_path / "model"  # a path of this test's own, to find its server by
    model.symlink_to(tiny_model_dir, target_is_directory=True)
    server_pattern = f"model-path {model} --kv-policy full"
    out = tmp_path / "policy.json"
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "sglang_pask.calibrate",
            "--model-path",
            str(model),
            "--out",
            str(out),
            "--kv-layer-groups",
            "0-0,1-1",
            "--max-tokens",
            "64",
            "--concurrency",
            "2",
        ],
        stderr=subprocess.PIPE,
        text=True,
    )
    done = re.compile(r"baseline \(full KV\):[^|]*\|[^|]*\| *(\d+)/(\d+)")
    seen = ""
    try:
        while not any(int(m.group(1)) >= 1 for m in done.finditer(seen)):  # the first answers are in
            chunk = process.stderr.read(1)
            assert chunk, f"calibration ended early: {seen[-2000:]}"
            seen += chunk
        answered = max(int(m.group(1)) for m in done.finditer(seen))
        total = int(done.search(seen).group(2))
        process.send_signal(signal.SIGTERM)
        _, rest = process.communicate(timeout=120)
        assert process.returncode == 128 + signal.SIGTERM
        # Only the requests in flight (2) finish after SIGTERM; the split's other queued items are
        # never sent (before request_pool, every one of them was answered first).
        finished = max([answered, *(int(m.group(1)) for m in done.finditer(rest))])
        assert finished <= answered + 4 < total, (answered, finished, total)
        assert not servers_of(server_pattern), "the calibration server outlived it"
        assert not out.exists()
    finally:
        process.kill()
        for server in servers_of(server_pattern):
            server.kill()


def servers_of(pattern: str) -> list[psutil.Process]:
    """Running processes whose command line contains ``pattern``."""
    found = []
    for candidate in psutil.process_iter(["cmdline"]):
        if pattern in " ".join(candidate.info["cmdline"] or []):
            found.append(candidate)
    return found


def test_reused_measurements_must_come_from_the_same_calibration(tmp_path):
    from sglang_pask.calibrate import recorded_rates

    source, _, per_group, joint, _ = measured_policy(tmp_path)
    reused = recorded_rates(str(source), ["simple_python_1"], "ebnf", "compress", "m", 2, "k4v2")
    assert reused.dropped == (per_group, joint) and reused.provenance["file"] == str(source)
    assert reused.lowbit is None and reused.provenance["reused"] == ["dropped"]  # no low-bit tier recorded
    with pytest.raises(ValueError, match="measured with other items, kv_decode than this calibration"):
        recorded_rates(str(source), ["simple_python_2"], "ebnf", "keep", "m", 2, "k4v2")
    with pytest.raises(ValueError, match="cannot read it"):
        recorded_rates(str(tmp_path / "absent.json"), [], "ebnf", "keep", "m", 2, "k4v2")
    run = calibrate("--reuse", str(source), "--model-path", str(tmp_path / "m"))
    assert run.returncode == 2 and "--reuse measures the low-bit tier only" in run.stderr


def test_low_bit_rates_are_scaled_to_the_every_token_rate():
    shares = [[0.2, 0.3, 0.0], [0.2, 0.3, 0.0]]
    scaled = scale_to_total([[0.1, 0.1, 0.5], [0.0, 0.2, 0.0]], shares, 0.2)
    assert sum(scaled, []) == pytest.approx([0.05, 0.05, 0.0, 0.0, 0.1, 0.0])  # the absent role counts nothing
    # Nothing measured per role but a loss with every token at low bits: spread by bytes.
    spread = scale_to_total([[0.0] * 3] * 2, shares, 0.1)
    assert sum(spread, []) == pytest.approx([0.02, 0.03, 0.0, 0.02, 0.03, 0.0])
    assert scale_to_total([[0.1, 0.1, 0.0]] * 2, shares, 0.0) == [[0.0, 0.0, 0.0]] * 2


def test_a_tiered_refit_needs_the_every_token_probe(tmp_path):
    source, model, _, _, _ = measured_policy(tmp_path)
    data = json.loads(source.read_text())
    data["calibration"].update(
        lowbit_format="k4v2",
        error_rate_lowbit_everywhere={"boundary": 0.0},
        error_rate_lowbit={"0:boundary": 0.0, "1:boundary": 0.0},
    )
    source.write_text(json.dumps(data))
    args = ("--refit", str(source), "--model-path", str(model), "--kv-bytes", "0.3", "--out", str(tmp_path / "t.json"))
    run = calibrate(*args)
    assert run.returncode == 2 and "error_rate_lowbit_all_roles" in run.stderr and "--reuse" in run.stderr
    data["calibration"]["error_rate_lowbit_all_roles"] = "high"
    source.write_text(json.dumps(data))
    run = calibrate(*args)
    assert run.returncode == 2 and "error_rate_lowbit_all_roles must be a rate in [0, 1], got 'high'" in run.stderr
    data["calibration"]["error_rate_lowbit_all_roles"] = 0.0
    source.write_text(json.dumps(data))
    run = calibrate(*args)
    assert run.returncode == 0, run.stderr[-2000:]
    assert json.loads((tmp_path / "t.json").read_text())["calibration"]["tier_predicted_bytes"] <= 0.3 + 1e-9
