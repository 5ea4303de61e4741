"""Per-token cost of role tagging next to xgrammar's own per-token cost, measured side by side.

For each grammar (a JSON-schema function call, a BFCL-style regex call list, a SQL EBNF query with
and without role captures) one token sequence runs through these loops, alternated for
``--repeats`` rounds on the same machine; each loop keeps its fastest round:

- ``xgr``: xgrammar alone, ``fill_next_token_bitmask`` + ``accept_token`` per token (what SGLang's
  grammar backend does per decoding step);
- ``both``: the same, then ``RoleTracker.extend`` over the accepted tokens and one read of the roles
  (the server tags when roles are read, :mod:`sglang_pask.srt.grammar`);
- ``tag``: ``RoleTracker.extend`` and the read alone (capture-based EBNF tracks need the matcher:
  not run alone).

In the server this is the whole per-token cost of the role track: ``RoleTrackedGrammar`` leaves
SGLang's ``accept_token`` as it is (SGLang already records the accepted tokens) and tags them when
its roles are read.

``added`` is the tagging cost over xgrammar's: ``tag / xgr`` (for capture tracks ``(both - xgr) /
xgr``). ``warm`` is the steady state (the grammar's memo already holds the sequence's transitions,
as for every request after the first with that grammar); ``cold`` uses a fresh role grammar per
round (the first request of a grammar; in BFCL every item has its own regex). Process-wide state is
warm in ``cold`` rounds: the interpreter, and the call-syntax memo that all call grammars share.

Compile time is not in the per-token figures of either side, so it is reported next to them, per
grammar as a new grammar costs in a running server. ``xgr compile``: the grammar's first compile;
the compiler keeps what it cached from the grammars compiled before (xgrammar reuses work across
grammars with shared rules: a BFCL item's EBNF compiles in about 2 ms after the first, about 90 ms
from an empty cache). ``role compile``: everything :meth:`RoleGrammar.compile` does, including the
tables it builds up front (a JSON schema's navigation tables); role grammars share no compile cache,
so every compile in the run is a full one and the fastest is kept. ``1st req`` is the whole first
request of a grammar: ``(role compile + n * tag cold) / (xgr compile + n * xgr)``.

``--bfcl N`` adds a sweep over the first N items of a BFCL category as the BFCL harness sends them
(its EBNF, the item's function docs, the reference answer as output): every item is a new grammar, so
every item is tagged cold, once, as in a real BFCL run.

Usage::

    python bench/role_tagging.py [--tokenizer toy|default|PATH] [--repeats 30] [--bfcl N] [--json OUT]

The output starts with the command, the date, the machine and the git commit measured.

``default`` is the project's default model tokenizer (Qwen2.5-Coder, 151k tokens) when it has been
prepared; ``toy`` a 4096-token BPE trained on the Python standard library.
"""

from __future__ import annotations

import argparse
import datetime
import gc
import json
import os
import platform
import re
import shlex
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sglang_pask.cli_paths import output_file
from sglang_pask.structure.tracker import RoleGrammar
from sglang_pask.structure.vocab import TokenVocab

_WEATHER = {
    "location": {"type": "string"},
    "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
    "days": {"type": "integer"},
    "alerts": {"type": "boolean"},
}
_TOOLS = [
    ("get_weather", {"type": "object", "properties": _WEATHER, "required": ["location", "days"]}),
    ("get_time", {"type": "object", "properties": {"timezone": {"type": "string"}}, "required": ["timezone"]}),
]
JSON_SCHEMA = {
    "type": "array",
    "minItems": 1,
    "items": {
        "type": "object",
        "anyOf": [
            {
                "properties": {"name": {"type": "string", "enum": [name]}, "parameters": params},
                "required": ["name", "parameters"],
            }
            for name, params in _TOOLS
        ],
    },
}
JSON_TEXT = (
    '[{"name": "get_weather", "parameters": {"location": "San Francisco, California", "unit": "celsius", '
    '"days": 14, "alerts": true}}, {"name": "get_time", "parameters": {"timezone": "Europe/Paris"}}]'
)
_AREA = r'calculate_triangle_area\(base=-?\d+, height=-?\d+(, unit=("units"|"cm"))?\)'
_FACT = r"math\.factorial\(number=-?\d+\)"
REGEX = rf"\[({_AREA}|{_FACT})(, ({_AREA}|{_FACT}))*\]"
REGEX_TEXT = '[calculate_triangle_area(base=10, height=5, unit="units"), math.factorial(number=5)]'
# The BFCL harness's form (sglang_pask.bfcl.grammar): one EBNF rule per function and per
# parameter-name set; which arguments are required comes from the function docs.
BFCL_EBNF = r"""root ::= "[" call ("," " "? call)* "]"
call ::= fn_0 | fn_1
fn_0 ::= "calculate_triangle_area(" (key_0 "=" value ("," " "? key_0 "=" value)*)? ")"
key_0 ::= "base" | "height" | "unit"
fn_1 ::= "math.factorial(" (key_1 "=" value ("," " "? key_1 "=" value)*)? ")"
key_1 ::= "number"
value ::= string | number | "True" | "False" | "None" | list | dict
list ::= "[" (value ("," " "? value)*)? "]"
dict ::= "{" (pair ("," " "? pair)*)? "}"
pair ::= string ":" " "? value
string ::= ("\"" ([^"\\\n] | "\\" [^\n])* "\"") | ("'" ([^'\\\n] | "\\" [^\n])* "'")
number ::= "-"? ("0" | [1-9] [0-9]*) ("." [0-9]+)? ([eE] [-+]? [0-9]+)?
"""
BFCL_DOCS = [
    {
        "name": "calculate_triangle_area",
        "parameters": {
            "type": "dict",
            "properties": {"base": {"type": "integer"}, "height": {"type": "integer"}, "unit": {"type": "string"}},
            "required": ["base", "height"],
        },
    },
    {
        "name": "math.factorial",
        "parameters": {"type": "dict", "properties": {"number": {"type": "integer"}}, "required": ["number"]},
    },
]
SQL = r"""root ::= "SELECT " columns " FROM " table where?
columns ::= column (", " column)*
column[capture="arg_key"] ::= [a-z_]+
table[capture="func_name"] ::= [a-z_]+
where ::= " WHERE " column " " op " " value (" AND " column " " op " " value)*
op ::= "=" | ">" | "<"
value ::= number | string
number[capture="value_number"] ::= [0-9]+
string[capture="value_string"] ::= "'" [^']* "'"
"""
SQL_TEXT = "SELECT name, age, city FROM users WHERE age > 30 AND city = 'New York' AND name = 'bob'"
SQL_PLAIN = re.sub(r'\[capture="[^"]*"\]', "", SQL)  # the same grammar without role captures

# name: (grammar kind, grammar, output text, function docs or None)
CASES: dict[str, tuple[str, str, str, list[dict[str, Any]] | None]] = {
    "json_function_call": ("json", json.dumps(JSON_SCHEMA), JSON_TEXT, None),
    "bfcl_regex_call": ("regex", REGEX, REGEX_TEXT, None),
    "bfcl_ebnf_call": ("ebnf", BFCL_EBNF, REGEX_TEXT, BFCL_DOCS),
    "sql_ebnf_captures": ("ebnf", SQL, SQL_TEXT, None),
    "sql_ebnf_lexer": ("ebnf", SQL_PLAIN, SQL_TEXT, None),
}


def load_tokenizer(which: str) -> tuple[Any, str]:
    """The tokenizer named by ``--tokenizer`` and a description of it."""
    if which == "toy":
        from sglang_pask.structure.toy_tokenizer import build_toy_tokenizer

        return build_toy_tokenizer(), "toy byte-level BPE (4096, Python stdlib)"
    from transformers import AutoTokenizer

    if which == "default":
        from sglang_pask.default_model import MODEL_NAME, default_model_dir, is_prepared

        if not is_prepared():
            raise SystemExit("the default model is not prepared; use --tokenizer toy or a path")
        return AutoTokenizer.from_pretrained(default_model_dir()), MODEL_NAME
    return AutoTokenizer.from_pretrained(which), which


def _timed(fn: Callable[[], int], rounds: list[int]) -> None:
    gc.disable()
    try:
        rounds.append(fn())
    finally:
        gc.enable()


def _compile_xgr(compiler: Any, kind: str, key: str) -> Any:
    if kind == "json":
        return compiler.compile_json_schema(key)
    if kind == "regex":
        return compiler.compile_regex(key)
    return compiler.compile_grammar(key)


class _Case:
    """One grammar and one accepted token sequence, with the three timed loops."""

    def __init__(self, kind: str, key: str, ids: list[int], functions: Any, vocab: TokenVocab, compiler: Any):
        import xgrammar

        self.xgrammar = xgrammar
        self.kind, self.key, self.ids, self.functions, self.vocab = kind, key, ids, functions, vocab
        start = time.perf_counter_ns()
        self.compiled = _compile_xgr(compiler, kind, key)
        self.xgr_compile_ns = time.perf_counter_ns() - start
        self.bitmask = xgrammar.allocate_token_bitmask(1, len(vocab))
        self.compile_ns: list[int] = []

    def fresh(self) -> RoleGrammar:
        """A new role grammar (its compile time is recorded)."""
        start = time.perf_counter_ns()
        grammar = RoleGrammar.compile(self.kind, self.key, self.vocab, functions=self.functions)
        self.compile_ns.append(time.perf_counter_ns() - start)
        return grammar

    def run_xgr(self) -> int:
        m = self.xgrammar.GrammarMatcher(self.compiled)
        bitmask = self.bitmask
        start = time.perf_counter_ns()
        for t in self.ids:
            m.fill_next_token_bitmask(bitmask)
            if not m.accept_token(t):
                raise RuntimeError(f"xgrammar rejected token {t} of the {self.kind} case")
        return time.perf_counter_ns() - start

    def run_both(self, grammar: RoleGrammar) -> int:
        m = self.xgrammar.GrammarMatcher(self.compiled)
        tracker = grammar.tracker(m)
        bitmask = self.bitmask
        accepted: list[int] = []  # SGLang's grammar object keeps this list anyway
        start = time.perf_counter_ns()
        for t in self.ids:
            m.fill_next_token_bitmask(bitmask)
            m.accept_token(t)
            accepted.append(t)
        tracker.extend(accepted)
        _ = tracker.roles  # capture tracks read their captures here, once per request
        return time.perf_counter_ns() - start

    def run_tag(self, grammar: RoleGrammar) -> int:
        tracker = grammar.tracker()
        start = time.perf_counter_ns()
        tracker.extend(self.ids)
        _ = tracker.roles  # a request's roles are read once, as in run_both
        return time.perf_counter_ns() - start


def bench_case(name: str, tok: Any, vocab: TokenVocab, compiler: Any, repeats: int) -> dict[str, Any]:
    """Time one case; per-token times in microseconds, compile times in milliseconds."""
    kind, key, text, functions = CASES[name]
    case = _Case(kind, key, tok.encode(text, add_special_tokens=False), functions, vocab, compiler)
    grammar = case.fresh()
    captures = bool(grammar.captures)
    case.run_both(grammar)  # warm the memo and the caches
    xgr: list[int] = []
    both: list[int] = []
    both_cold: list[int] = []
    tag: list[int] = []
    tag_cold: list[int] = []
    for _ in range(repeats):
        _timed(case.run_xgr, xgr)
        _timed(lambda: case.run_both(grammar), both)
        _timed(lambda: case.run_both(case.fresh()), both_cold)
        if not captures:
            _timed(lambda: case.run_tag(grammar), tag)
            _timed(lambda: case.run_tag(case.fresh()), tag_cold)
    n = len(case.ids)
    us = {k: min(v) / n / 1e3 for k, v in [("xgr", xgr), ("both", both), ("both_cold", both_cold)]}
    if captures:
        us["tag"] = max(us["both"] - us["xgr"], 0.0)
        us["tag_cold"] = max(us["both_cold"] - us["xgr"], 0.0)
    else:
        us["tag"] = min(tag) / n / 1e3
        us["tag_cold"] = min(tag_cold) / n / 1e3
    role_compile_us = min(case.compile_ns) / 1e3
    xgr_compile_us = case.xgr_compile_ns / 1e3
    return {
        "case": name,
        "kind": kind,
        "tokens": n,
        "captures": captures,
        "xgr_us_per_token": us["xgr"],
        "tag_warm_us_per_token": us["tag"],
        "tag_cold_us_per_token": us["tag_cold"],
        "added_warm": us["tag"] / us["xgr"],
        "added_cold": us["tag_cold"] / us["xgr"],
        "role_compile_ms": role_compile_us / 1e3,
        "xgr_compile_ms": xgr_compile_us / 1e3,
        "added_first_request": (role_compile_us + n * us["tag_cold"]) / (xgr_compile_us + n * us["xgr"]),
    }


def bench_bfcl(tok: Any, vocab: TokenVocab, compiler: Any, n_items: int, category: str, repeats: int) -> dict[str, Any]:
    """BFCL items in order, each a new grammar (the harness's EBNF) with the item's function docs.

    The reference answer (first allowed value of each parameter) stands in for the model's output.
    ``first``: the item's first pass, when the shared call-syntax memo has not seen its tokens yet;
    ``new grammar``: fastest of ``repeats`` passes, each with a new role grammar (the syntax memo has
    seen the tokens, as in a server that has served similar calls).
    """
    from sglang_pask.bfcl.data import load_category
    from sglang_pask.bfcl.grammar import item_ebnf
    from sglang_pask.bfcl.oracle import oracle_answer

    xgr_ns = first_ns = fresh_ns = tokens = 0
    role_compile_ns = xgr_compile_ns = 0
    items = load_category(category)[:n_items]
    for item in items:
        case = _Case("ebnf", item_ebnf(item), tok.encode(oracle_answer(item), add_special_tokens=False),
                     item.functions, vocab, compiler)  # fmt: skip
        first: list[int] = []
        _timed(lambda c=case: c.run_tag(c.fresh()), first)
        xgr: list[int] = []
        fresh: list[int] = []
        for _ in range(repeats):
            _timed(case.run_xgr, xgr)
            _timed(lambda c=case: c.run_tag(c.fresh()), fresh)
        xgr_ns += min(xgr)
        first_ns += first[0]
        fresh_ns += min(fresh)
        tokens += len(case.ids)
        role_compile_ns += min(case.compile_ns)
        xgr_compile_ns += case.xgr_compile_ns
    return {
        "case": f"bfcl_{category}_sweep",
        "kind": "ebnf",
        "items": len(items),
        "tokens": tokens,
        "xgr_us_per_token": xgr_ns / tokens / 1e3,
        "tag_first_us_per_token": first_ns / tokens / 1e3,
        "tag_new_grammar_us_per_token": fresh_ns / tokens / 1e3,
        "added_first": first_ns / xgr_ns,
        "added_new_grammar": fresh_ns / xgr_ns,
        "role_compile_ms": role_compile_ns / len(items) / 1e6,
        "xgr_compile_ms": xgr_compile_ns / len(items) / 1e6,
    }


def run_header(argv: list[str]) -> dict[str, str]:
    """Command, date, machine, versions and git commit of this run."""
    from importlib.metadata import version

    root = Path(__file__).resolve().parents[1]

    def git(*args: str) -> str:
        return subprocess.run(["git", *args], check=False, cwd=root, capture_output=True, text=True).stdout.strip()

    cpuinfo = Path("/proc/cpuinfo")
    models = re.findall(r"model name\s*:\s*(.+)", cpuinfo.read_text()) if cpuinfo.exists() else []
    cpu = models[0] if models else (platform.processor() or "unknown CPU")
    commit = git("rev-parse", "--short=12", "HEAD") or "unknown"
    if git("status", "--porcelain", "--", "sglang_pask/structure", "bench/role_tagging.py"):
        commit += " plus uncommitted changes to sglang_pask/structure or this bench"
    return {
        "command": shlex.join(["python", "bench/role_tagging.py", *argv]),
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%MZ"),
        "machine": f"{platform.system()} {platform.machine()}, {cpu}, {os.cpu_count()} CPUs",
        "versions": f"python {platform.python_version()}, xgrammar {version('xgrammar')}",
        "commit": commit,
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokenizer", default="toy", help="toy | default | path of a Hugging Face tokenizer")
    parser.add_argument("--repeats", type=int, default=30, help="rounds per loop (the fastest is kept)")
    parser.add_argument("--cases", nargs="*", default=list(CASES), choices=list(CASES))
    parser.add_argument(
        "--bfcl",
        type=int,
        default=0,
        metavar="N",
        help="also sweep the first N items of a BFCL category, one new grammar each",
    )
    parser.add_argument("--bfcl-category", default="simple_python")
    parser.add_argument("--json", type=output_file, metavar="OUT", help="also write the results as JSON")
    args = parser.parse_args(argv)
    header = run_header(sys.argv[1:] if argv is None else argv)
    for key, value in header.items():
        print(f"{key}: {value}")

    import xgrammar

    tok, tok_name = load_tokenizer(args.tokenizer)
    start = time.perf_counter_ns()
    info = xgrammar.TokenizerInfo.from_huggingface(tok, vocab_size=len(tok))
    info_ms = (time.perf_counter_ns() - start) / 1e6
    start = time.perf_counter_ns()
    vocab = TokenVocab.from_xgrammar(info, extra_special_ids=tok.all_special_ids)
    vocab_ms = (time.perf_counter_ns() - start) / 1e6
    compiler = xgrammar.GrammarCompiler(info, max_threads=1)
    rows = [bench_case(name, tok, vocab, compiler, args.repeats) for name in args.cases]

    print(f"tokenizer: {tok_name} ({info.vocab_size} tokens); {args.repeats} rounds, fastest kept")
    print(f"tokenizer tables, once per process: xgrammar TokenizerInfo {info_ms:.0f} ms, TokenVocab {vocab_ms:.0f} ms")
    print("compile per grammar: xgrammar its first compile (cache kept from earlier grammars), role the fastest")
    head = f"{'case':<20} {'tok':>4} {'xgr us/tok':>11} {'tag warm':>9} {'added':>7} {'tag cold':>9} {'added':>7}"
    head += f" {'role compile ms':>16} {'xgr compile ms':>15} {'1st req':>8}"
    print(head)
    print("-" * len(head))
    for r in rows:
        print(
            f"{r['case']:<20} {r['tokens']:>4} {r['xgr_us_per_token']:>11.2f} {r['tag_warm_us_per_token']:>9.2f}"
            f" {r['added_warm']:>7.1%} {r['tag_cold_us_per_token']:>9.2f} {r['added_cold']:>7.1%}"
            f" {r['role_compile_ms']:>16.3f} {r['xgr_compile_ms']:>15.3f} {r['added_first_request']:>8.1%}"
        )
    print("added = tagging / xgrammar (fill_next_token_bitmask + accept_token); capture rows: (both - xgr) / xgr")
    print("1st req = (role compile + tokens * tag cold) / (xgr compile + tokens * xgr)")
    sweep = None
    if args.bfcl:
        sweep = bench_bfcl(tok, vocab, compiler, args.bfcl, args.bfcl_category, args.repeats)
        print(
            f"\n{sweep['case']}: {sweep['items']} items, {sweep['tokens']} tokens, every item a new grammar\n"
            f"  xgr {sweep['xgr_us_per_token']:.2f} us/token; tagging: first pass"
            f" {sweep['tag_first_us_per_token']:.2f} us/token ({sweep['added_first']:.1%}), new grammar"
            f" {sweep['tag_new_grammar_us_per_token']:.2f} us/token ({sweep['added_new_grammar']:.1%})\n"
            f"  compile per item: role grammar {sweep['role_compile_ms']:.3f} ms,"
            f" xgrammar {sweep['xgr_compile_ms']:.1f} ms"
        )
    if args.json:
        meta = {
            **header,
            "tokenizer": tok_name,
            "vocab_size": info.vocab_size,
            "repeats": args.repeats,
            "tokenizer_info_ms": info_ms,
            "token_vocab_ms": vocab_ms,
        }
        out = {"meta": meta, "rows": rows, "bfcl_sweep": sweep}
        Path(args.json).write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
