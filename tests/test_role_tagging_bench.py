"""``bench/role_tagging.py`` on the toy tokenizer, one round: every case and the BFCL sweep measured.

A dry run for the benchmark's mechanics (its loops run real xgrammar and real role tracks);
its timings mean nothing at one round and are not checked beyond being measured.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]


def test_one_round_measures_every_case_and_the_bfcl_sweep(tmp_path: Path) -> None:
    out = tmp_path / "role_tagging.json"
    proc = subprocess.run(
        [sys.executable, str(REPO_ROOT / "bench" / "role_tagging.py"), "--tokenizer", "toy", "--repeats", "1",
         "--bfcl", "2", "--json", str(out)],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads(out.read_text())
    assert result["meta"]["commit"] and result["meta"]["repeats"] == 1
    rows = {row["case"]: row for row in result["rows"]}
    assert set(rows) == {"json_function_call", "bfcl_regex_call", "bfcl_ebnf_call", "sql_ebnf_captures",
                         "sql_ebnf_lexer"}  # fmt: skip
    for row in rows.values():
        assert row["tokens"] > 10
        for key in ("xgr_us_per_token", "role_compile_ms", "xgr_compile_ms"):
            assert row[key] > 0, key
        # Timed directly without captures; with captures it is a difference of two timings (both - xgrammar
        # alone), clipped at zero, which one noisy round can bring to zero.
        assert row["tag_cold_us_per_token"] >= 0 if row["captures"] else row["tag_cold_us_per_token"] > 0
    assert not rows["bfcl_regex_call"]["captures"] and rows["sql_ebnf_captures"]["captures"]
    sweep = result["bfcl_sweep"]
    assert sweep["items"] == 2 and sweep["tokens"] > 0 and sweep["tag_first_us_per_token"] > 0
    assert "1st req" in proc.stdout
