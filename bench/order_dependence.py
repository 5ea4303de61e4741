"""Does a compressed request's answer depend on the request that ran before it? ``python -m bench.order_dependence``

With the radix prefix cache on, a request that matches a prefix computed by an earlier request reads
that prefix as the earlier request kept it (README, layer-group KV). BFCL items share BFCL's system
prompt, so under compression an item's answer can depend on which item computed that prompt first.
This bench measures it: for each of ``--items`` BFCL items (the target), on a server started with
``--kv-policy`` and ``--kv-budget``, it asks the target with an empty cache (``/flush_cache``), then
again after each of the other items (cache flushed before each pair), and counts the answers that
differ from the one given alone. It does so once with the radix cache on and once with it off
(``--disable-radix-cache``), one server at a time. Greedy, EBNF-constrained, one request at a time.

Prints a table; ``--json`` writes every answer with the command, date, machine and commit.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

import requests
from tqdm import tqdm

from bench.bfcl import ask, select_items, served_model, server_flags
from bench.common import exit_on_sigterm, run_header
from sglang_pask.bfcl.data import AST_CATEGORIES, BfclItem
from sglang_pask.cli_paths import output_file


def flush_cache(url: str, wait_s: float = 60.0) -> None:
    """Empty the server's radix cache, waiting up to ``wait_s`` for the last request to leave the
    scheduler (SGLang refuses to flush while a request runs).

    Raises
    ------
    RuntimeError
        If the server still refused after ``wait_s``.
    """
    response = requests.post(f"{url}/flush_cache", params={"timeout": wait_s}, timeout=wait_s + 60)
    if response.status_code != 200:
        raise RuntimeError(f"{url}/flush_cache refused after {wait_s:g} s: {response.text.strip()}")


def answers_after_each_other(url: str, items: Sequence[BfclItem], max_tokens: int) -> dict[str, dict[str, str]]:
    """Per target item: its answer alone (key ``""``) and right after each other item (key: that id)."""
    model = served_model(url)
    found: dict[str, dict[str, str]] = {}
    pairs = [(target, None) for target in items] + [(t, o) for t in items for o in items if o is not t]
    for target, before in tqdm(pairs, desc=url, file=sys.stderr):
        flush_cache(url)
        if before is not None:
            ask(url, model, before, "ebnf", max_tokens, 900)
        answer = ask(url, model, target, "ebnf", max_tokens, 900).output
        found.setdefault(target.id, {})["" if before is None else before.id] = answer
    return found


def changed(answers: dict[str, dict[str, str]]) -> tuple[int, int]:
    """``(pairs whose target answer differs from the target alone, pairs)``."""
    pairs = [(per[""], other) for per in answers.values() for key, other in per.items() if key]
    return sum(other != alone for alone, other in pairs), len(pairs)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m bench.order_dependence",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("--policy", default="pask", help="--kv-policy of the servers")
    p.add_argument("--budget", type=float, default=0.33, help="--kv-budget of the servers")
    p.add_argument(
        "--items",
        nargs="+",
        default=["simple_python_3", "parallel_0", "multiple_3"],
        help="BFCL item ids (the default ones are evaluation-split items); each is asked alone and after each other",
    )
    p.add_argument("--server-args", default="--kv-layer-groups 4", help="more launcher arguments")
    p.add_argument("--max-tokens", type=int, default=256, help="answer length cap")
    p.add_argument("--json", type=output_file, help="write every answer here")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    header = run_header("python -m bench.order_dependence", argv)
    if len(args.items) < 2:
        parser.error("--items: give at least two items")
    if not 0 < args.budget <= 1:
        parser.error(f"--budget must be in (0, 1], got {args.budget:g}")
    if args.max_tokens < 1:
        parser.error(f"--max-tokens must be at least 1, got {args.max_tokens}")
    by_id = {item.id: item for item in select_items(AST_CATEGORIES, None, None, None)}
    unknown = [i for i in args.items if i not in by_id]
    if unknown:
        parser.error(f"--items: unknown BFCL item ids {unknown}")
    items = [by_id[i] for i in args.items]
    from sglang_pask.server_process import ServerProcess

    results = {}
    with tempfile.TemporaryDirectory(prefix="bench-order-") as log_dir:
        for radix in (True, False):
            flags = server_flags(args.server_args, args.policy, args.budget, radix_cache=radix)
            server = ServerProcess(flags, Path(log_dir) / f"radix_{radix}.log").wait_ready(timeout_s=900)
            try:
                results["on" if radix else "off"] = answers_after_each_other(server.url, items, args.max_tokens)
            finally:
                server.stop()
    print(f"{args.policy}@{args.budget:g}: answers that differ from the same item asked alone")
    for key, answers in results.items():
        differ, pairs = changed(answers)
        print(f"  radix cache {key:3}: {differ} of {pairs} (item, item before it) pairs")
    if args.json:
        Path(args.json).write_text(
            json.dumps({**header, "policy": args.policy, "budget": args.budget, "answers": results}, indent=1) + "\n"
        )
    return 0


if __name__ == "__main__":
    exit_on_sigterm()
    raise SystemExit(main())
