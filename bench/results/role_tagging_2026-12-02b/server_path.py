"""One-off check: the role track's cost on SGLang's own per-token path, before and after 599c112.

Runs the same steps SGLang runs per decoding step (``fill_vocab_mask`` + ``accept_token``) through
three grammar objects, each in its own loop (its own code object, so CPython's per-call-site caches
see one class each), alternated for 100 rounds, fastest kept:

- ``stock``: an empty subclass of SGLang's ``XGrammarGrammar`` (an empty subclass runs these steps
  about 0.1 us per token faster than ``XGrammarGrammar`` itself on CPython 3.11; comparing
  subclasses with subclasses leaves only what the role track adds);
- ``old``: ``RoleTrackedGrammar`` as of 98f2ca5 (tags in an ``accept_token`` override), roles read
  once; it runs on the current ``RoleTracker``, whose ``accept`` costs what 98f2ca5's did (measured
  on the BFCL regex call: 0.32-0.34 against 0.33-0.34 us per token);
- ``new``: the current ``RoleTrackedGrammar`` (tags when ``roles()`` is read), roles read once.

Added = (object - stock) / xgrammar's own per-token cost (``fill_next_token_bitmask`` +
``accept_token`` on the bare matcher). Run from the repository root::

    .venv/bin/python bench/results/role_tagging_2026-12-02b/server_path.py
"""

from __future__ import annotations

import gc
import subprocess
import sys
import time
import types
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[3]
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]

import role_tagging  # noqa: E402
import xgrammar  # noqa: E402
from sglang.srt.constrained.xgrammar_backend import XGrammarGrammar  # noqa: E402

from sglang_pask.srt.role_grammar import RoleTrackedGrammar  # noqa: E402
from sglang_pask.structure.vocab import TokenVocab  # noqa: E402

OLD_COMMIT = "98f2ca5"


def old_wrapper_class() -> type:
    source = subprocess.run(["git", "show", f"{OLD_COMMIT}:sglang_pask/srt/role_grammar.py"], cwd=ROOT,
                            capture_output=True, text=True, check=True).stdout  # fmt: skip
    module = types.ModuleType("old_role_grammar")
    exec(compile(source, "old_role_grammar.py", "exec"), module.__dict__)
    return module.RoleTrackedGrammar


class StockGrammar(XGrammarGrammar):
    """SGLang's class, unchanged."""


def steps(grammar: Any, ids: list[int], bitmask: Any) -> int:
    start = time.perf_counter_ns()
    for t in ids:
        grammar.fill_vocab_mask(bitmask, 0)
        grammar.accept_token(t)
    return time.perf_counter_ns() - start


def steps_old(grammar: Any, ids: list[int], bitmask: Any) -> int:
    start = time.perf_counter_ns()
    for t in ids:
        grammar.fill_vocab_mask(bitmask, 0)
        grammar.accept_token(t)
    _ = grammar.role_tracker.roles
    return time.perf_counter_ns() - start


def steps_new(grammar: Any, ids: list[int], bitmask: Any) -> int:
    start = time.perf_counter_ns()
    for t in ids:
        grammar.fill_vocab_mask(bitmask, 0)
        grammar.accept_token(t)
    _ = grammar.roles()
    return time.perf_counter_ns() - start


def main() -> None:
    old_class = old_wrapper_class()
    tok, name = role_tagging.load_tokenizer("default")
    info = xgrammar.TokenizerInfo.from_huggingface(tok, vocab_size=len(tok))
    vocab = TokenVocab.from_xgrammar(info, extra_special_ids=tok.all_special_ids)
    compiler = xgrammar.GrammarCompiler(info, max_threads=1)
    print(f"tokenizer {name}; old = {OLD_COMMIT}; 100 rounds, fastest kept; us per token")
    for case_name in ("json_function_call", "bfcl_regex_call", "bfcl_ebnf_call"):
        kind, key, text, functions = role_tagging.CASES[case_name]
        case = role_tagging._Case(kind, key, tok.encode(text, add_special_tokens=False), functions, vocab, compiler)
        role_grammar = case.fresh()
        ids, bitmask, compiled = case.ids, case.bitmask, case.compiled

        def make(cls: type, **kwargs: Any) -> Any:
            return cls(xgrammar.GrammarMatcher(compiled), len(vocab), compiled, None, key, **kwargs)

        rounds: dict[str, list[int]] = {"xgr": [], "stock": [], "old": [], "new": []}
        for _ in range(100):
            gc.disable()
            rounds["xgr"].append(case.run_xgr())
            rounds["stock"].append(steps(make(StockGrammar), ids, bitmask))
            rounds["old"].append(steps_old(make(old_class, role_grammar=role_grammar), ids, bitmask))
            rounds["new"].append(steps_new(make(RoleTrackedGrammar, role_grammar=role_grammar), ids, bitmask))
            gc.enable()
        us = {k: min(v) / len(ids) / 1e3 for k, v in rounds.items()}
        print(f"{case_name:<20} xgr {us['xgr']:.2f}  stock {us['stock']:.2f}"
              f"  old {us['old']:.2f} (+{(us['old'] - us['stock']) / us['xgr']:.1%})"
              f"  new {us['new']:.2f} (+{(us['new'] - us['stock']) / us['xgr']:.1%})")  # fmt: skip


if __name__ == "__main__":
    main()
