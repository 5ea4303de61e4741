"""Replay what a compressed server kept in transformers: does each answer follow from exactly that KV?

A compressed server says, per layer group, which prompt positions it kept (``return_kv_kept``). This
checks end to end that its answers are computed from exactly those keys and values, at the positions
they were written, and from nothing else. For each item the server answers greedily and
unconstrained, with the log-probability of every answer token. The same model in transformers
(eager attention, the server's dtype: float32 unless ``--server-args`` names one) then reads prompt and answer in one teacher-forced pass in
which the prompt's queries see the whole prompt (the server compresses after the prefill) and each
layer's answer queries see only the prompt positions its group kept, plus every answer token (all of
them stay under ``--kv-decode keep``). If the server reads what it says it keeps, the two
log-probabilities agree to rounding and transformers' greedy token is the server's at every step;
the same pass with nothing masked (full KV) shows how far the compression moved them, so the check
has teeth.

    python -m bench.kept_set_reference --split calib --limit 2 --json kept.json --markdown kept.md

Needs ``--kv-decode keep`` (a decode step that compresses changes the kept set while the answer is
written) and no StructKV (its prefill is pruned); the servers it starts have the radix cache off,
so every prompt is computed whole.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import requests
import torch
from tqdm import tqdm

from bench.bfcl import select_items
from bench.common import exit_on_sigterm, markdown_header, run_header
from sglang_pask.bfcl.data import AST_CATEGORIES
from sglang_pask.bfcl.prompt import build_messages
from sglang_pask.bfcl.split import SPLITS
from sglang_pask.cli_paths import output_file
from sglang_pask.default_model import ensure_default_model
from sglang_pask.server_process import ServerProcess, ServerStartError

DEFAULT_SERVER_ARGS = "--kv-policy pask --kv-budget 0.28 --kv-layer-groups 4 --kv-decode keep"
# Refused in --server-args: what makes the kept set at the end not the one every answer step read.
REFUSED_FLAGS = ("--structkv",)


@dataclass
class ItemReplay:
    """One item: the server's answer and how transformers' replays of it compare.

    Attributes
    ----------
    id : str
        The BFCL item id.
    prompt_tokens, answer_tokens : int
        Lengths.
    kept_share : list[float]
        ``(num_groups,)``: the share of the prompt's positions each group kept.
    answer_kept : bool
        Whether every group kept every answer position the server wrote.
    masked_max_abs_diff, full_max_abs_diff : float
        Largest ``|server log-prob - replay log-prob|`` over the answer's tokens, for the replay
        masked to the kept positions and for the unmasked one.
    masked_greedy_agree, full_greedy_agree : int
        Answer steps at which the replay's most likely token is the server's token.
    """

    id: str
    prompt_tokens: int
    answer_tokens: int
    kept_share: list[float]
    answer_kept: bool
    masked_max_abs_diff: float
    full_max_abs_diff: float
    masked_greedy_agree: int
    full_greedy_agree: int


def layer_groups_of(ranges: Sequence[str]) -> list[int]:
    """``["0-5", "6-11"]`` (``/server_info``'s group layers) -> the group of every layer, ``(num_layers,)``."""
    group_of: list[int] = []
    for group, text in enumerate(ranges):
        first, last = (int(part) for part in text.split("-"))
        if first != len(group_of) or last < first:
            raise ValueError(f"layer groups must cover the layers in order, got {list(ranges)}")
        group_of.extend([group] * (last - first + 1))
    return group_of


def group_masks(
    prompt_len: int, total_len: int, kept: Sequence[Sequence[int]], dtype: torch.dtype
) -> list[torch.Tensor]:
    """Additive attention masks, one per layer group, for a teacher-forced pass over prompt and answer.

    Parameters
    ----------
    prompt_len : int
        ``P``: rows and columns below it are the prompt's.
    total_len : int
        ``L``: prompt plus answer tokens fed.
    kept : sequence of sequence of int
        ``(num_groups,)`` positions each group kept (answer positions among them are ignored: every
        answer position is read).
    dtype : torch.dtype
        The masks' dtype (the model's).

    Returns
    -------
    list of Tensor
        ``(num_groups,)`` of ``(1, 1, L, L)``: 0 where query row ``i`` reads key ``j`` (``j <= i``, and
        for an answer row ``i >= P`` a prompt key only if its group kept it), the dtype's minimum
        elsewhere.
    """
    causal = torch.ones(total_len, total_len, dtype=torch.bool).tril()
    masks = []
    for positions in kept:
        prompt_kept = torch.zeros(total_len, dtype=torch.bool)
        chosen = torch.tensor([p for p in positions if p < prompt_len], dtype=torch.int64)
        prompt_kept[chosen] = True
        prompt_kept[prompt_len:] = True
        reads = causal.clone()
        reads[prompt_len:] &= prompt_kept[None, :]
        mask = torch.zeros(total_len, total_len, dtype=dtype).masked_fill(~reads, torch.finfo(dtype).min)
        masks.append(mask[None, None])
    return masks


def replay_logprobs(
    model: Any, token_ids: Sequence[int], prompt_len: int, layer_masks: Sequence[torch.Tensor] | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """One teacher-forced pass of a transformers causal LM over ``token_ids``.

    Parameters
    ----------
    model : transformers model
        Eager attention; its decoder layers at ``model.model.layers``.
    token_ids : sequence of int
        ``(L,)`` prompt then answer (the answer's last token need not be fed: it is scored, not read).
    prompt_len : int
        ``P``.
    layer_masks : sequence of Tensor or None
        ``(num_layers,)`` of ``(1, 1, L, L)`` additive masks, one per layer; None: plain causal.

    Returns
    -------
    tuple of Tensor
        ``(L - P,)`` float64 log-probabilities of tokens ``P .. L-1`` and ``(L - P,)`` int64 the most
        likely token at those steps (the logits of rows ``P-1 .. L-2``).
    """
    ids = torch.tensor([list(token_ids)], dtype=torch.int64)
    handles = []
    if layer_masks is not None:
        for layer, mask in zip(model.model.layers, layer_masks):

            def use_mask(module: Any, args: tuple, kwargs: dict, mask: torch.Tensor = mask) -> tuple[tuple, dict]:
                return args, {**kwargs, "attention_mask": mask}

            handles.append(layer.self_attn.register_forward_pre_hook(use_mask, with_kwargs=True))
    try:
        with torch.no_grad():
            logits = model(input_ids=ids).logits[0, prompt_len - 1 : -1].double()
    finally:
        for handle in handles:
            handle.remove()
    logprobs = torch.log_softmax(logits, dim=-1)
    answer = ids[0, prompt_len:]
    return logprobs.gather(1, answer[:, None])[:, 0], logprobs.argmax(dim=-1)


def compare_item(
    model: Any,
    group_of_layer: Sequence[int],
    item_id: str,
    prompt_ids: Sequence[int],
    answer_ids: Sequence[int],
    server_logprobs: Sequence[float],
    kept: Sequence[Sequence[int]],
) -> ItemReplay:
    """Replay one server answer masked to ``kept`` and unmasked, and compare both with the server."""
    prompt_len, answer_len = len(prompt_ids), len(answer_ids)
    token_ids = [*prompt_ids, *answer_ids]
    masks = group_masks(prompt_len, len(token_ids), kept, model.dtype)
    masked_lp, masked_top = replay_logprobs(model, token_ids, prompt_len, [masks[g] for g in group_of_layer])
    full_lp, full_top = replay_logprobs(model, token_ids, prompt_len, None)
    server = torch.tensor(list(server_logprobs), dtype=torch.float64)
    answer = torch.tensor(list(answer_ids), dtype=torch.int64)
    # The last answer token is sampled, never fed: positions P .. P+T-2 are what the server wrote.
    written = set(range(prompt_len, prompt_len + answer_len - 1))
    return ItemReplay(
        id=item_id,
        prompt_tokens=prompt_len,
        answer_tokens=answer_len,
        kept_share=[sum(p < prompt_len for p in positions) / prompt_len for positions in kept],
        answer_kept=all(written <= set(positions) for positions in kept),
        masked_max_abs_diff=float((server - masked_lp).abs().max()),
        full_max_abs_diff=float((server - full_lp).abs().max()),
        masked_greedy_agree=int((masked_top == answer).sum()),
        full_greedy_agree=int((full_top == answer).sum()),
    )


def ask(
    url: str, prompt_ids: Sequence[int], max_new_tokens: int, timeout_s: float
) -> tuple[list[int], list[float], list[list[int]]]:
    """A greedy, unconstrained ``/generate`` with log-probabilities and ``return_kv_kept``.

    Returns
    -------
    tuple
        The answer's token ids, their log-probabilities, and per group the positions kept.
    """
    body = {
        "input_ids": list(prompt_ids),
        "sampling_params": {"temperature": 0, "max_new_tokens": max_new_tokens, "return_kv_kept": True},
        "return_logprob": True,
    }
    response = requests.post(f"{url}/generate", json=body, timeout=timeout_s)
    response.raise_for_status()
    meta = response.json()["meta_info"]
    pairs = meta["output_token_logprobs"]
    return [int(t) for _, t, *_ in pairs], [float(lp) for lp, *_ in pairs], meta["kv_stats"]["kept_positions"]


# --dtype values of the server that the replay can match.
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def server_layer_groups(url: str) -> list[int]:
    """The group of every layer of a running layer-group server (``/server_info``)."""
    info = requests.get(f"{url}/server_info", timeout=30).json()
    state = info["internal_states"][0]["sglang_pask"]
    return layer_groups_of([group["layers"] for group in state["kv_pool"]["groups"]])


def load_reference(model_path: str, dtype: torch.dtype) -> Any:
    """The served model in transformers with eager attention, in ``dtype``."""
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(model_path, dtype=dtype, attn_implementation="eager").eval()


def summary_lines(replays: Sequence[ItemReplay]) -> list[str]:
    """A markdown table, one row per item, and the totals."""
    lines = [
        "| item | prompt | answer | kept share per group | answer kept | max abs diff, kept-set replay | greedy agree, kept-set replay | max abs diff, full KV replay | greedy agree, full KV replay |",
        "|---|---:|---:|---|:-:|---:|---:|---:|---:|",
    ]
    for r in replays:
        shares = " / ".join(f"{s:.2f}" for s in r.kept_share)
        lines.append(
            f"| {r.id} | {r.prompt_tokens} | {r.answer_tokens} | {shares} | {'yes' if r.answer_kept else 'NO'} "
            f"| {r.masked_max_abs_diff:.2e} | {r.masked_greedy_agree}/{r.answer_tokens} "
            f"| {r.full_max_abs_diff:.2e} | {r.full_greedy_agree}/{r.answer_tokens} |"
        )
    steps = sum(r.answer_tokens for r in replays)
    lines += [
        "",
        f"- answer steps: {steps} over {len(replays)} items",
        f"- kept-set replay: largest log-prob difference {max(r.masked_max_abs_diff for r in replays):.2e}, "
        f"greedy token the server's at {sum(r.masked_greedy_agree for r in replays)} of {steps} steps",
        f"- full KV replay: largest log-prob difference {max(r.full_max_abs_diff for r in replays):.2e}, "
        f"greedy token the server's at {sum(r.full_greedy_agree for r in replays)} of {steps} steps",
        f"- every answer position kept by every group: {'yes' if all(r.answer_kept for r in replays) else 'NO'}",
    ]
    return lines


def build_parser() -> argparse.ArgumentParser:
    """The command-line interface."""
    p = argparse.ArgumentParser(
        prog="python -m bench.kept_set_reference",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("--model-path", help="model to serve and replay (None: the default model)")
    p.add_argument(
        "--server-args",
        default=DEFAULT_SERVER_ARGS,
        help="launcher arguments of the compressed server (shell syntax; --kv-decode keep required, "
        "--structkv and --kv-dropped 2bit refused; --disable-radix-cache is added)",
    )
    p.add_argument("--categories", nargs="+", default=list(AST_CATEGORIES), help="BFCL AST categories")
    p.add_argument("--split", choices=SPLITS, default="calib", help="BFCL split the items come from")
    p.add_argument("--limit", type=int, default=1, help="items per category (the first ones)")
    p.add_argument("--max-new-tokens", type=int, default=48, help="answer length cap")
    p.add_argument("--request-timeout", type=float, default=900.0, help="seconds per request")
    p.add_argument("--server-timeout", type=float, default=900.0, help="seconds to wait for the server")
    p.add_argument("--json", type=output_file, help="write every item's figures here")
    p.add_argument("--markdown", type=output_file, help="write the table here")
    return p


def _flag_value(flags: Sequence[str], name: str) -> str | None:
    """The word after ``name`` in ``flags`` ("" if ``name`` ends them), or None if ``name`` is absent."""
    if name not in flags:
        return None
    rest = flags[flags.index(name) + 1 :]
    return rest[0] if rest else ""


def checked_server_args(parser: argparse.ArgumentParser, text: str) -> list[str]:
    """``--server-args`` split, refused (usage error) where a replay could not be exact; ``--dtype
    float32`` and ``--disable-radix-cache`` added where missing."""
    flags = shlex.split(text)
    if _flag_value(flags, "--kv-decode") != "keep":
        parser.error(
            "--server-args needs --kv-decode keep: when decode compresses, the kept set changes while the "
            "answer is written and its last state describes no single step"
        )
    for flag in REFUSED_FLAGS:
        if flag in flags:
            parser.error(f"--server-args: {flag} prunes the prefill itself, which this replay does not model")
    if _flag_value(flags, "--kv-dropped") not in (None, "drop"):
        parser.error(
            "--server-args: --kv-dropped 2bit keeps dropped tokens at 2 bits, and this replay reads only "
            "the full-precision kept set"
        )
    if "--kv-policy" not in flags:
        parser.error("--server-args needs a --kv-policy (a compressed server is what is checked)")
    if "--model-path" in flags:
        parser.error(
            "give the model with --model-path, not inside --server-args (both the server and the replay use it)"
        )
    dtype = _flag_value(flags, "--dtype")
    if dtype is None:
        flags += ["--dtype", "float32"]
    elif dtype not in DTYPES:
        parser.error(f"--server-args: --dtype must be one of {', '.join(DTYPES)} (the replay runs in the same dtype)")
    if "--disable-radix-cache" not in flags:
        flags.append("--disable-radix-cache")
    return flags


def main(argv: Sequence[str] | None = None) -> int:
    exit_on_sigterm()
    parser = build_parser()
    args = parser.parse_args(argv)
    flags = checked_server_args(parser, args.server_args)
    if args.limit < 1 or args.max_new_tokens < 1:
        parser.error("--limit and --max-new-tokens must be at least 1")
    try:
        items = select_items(args.categories, args.split, None, args.limit)
    except ValueError as err:
        parser.error(str(err))
    model_path = args.model_path or str(ensure_default_model())
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_path)
    header = run_header("bench.kept_set_reference", argv)
    log = Path(tempfile.mkdtemp(prefix="kept_set_reference_")) / "server.log"
    server = ServerProcess(["--model-path", model_path, *flags], log)
    replays: list[ItemReplay] = []
    try:
        try:
            server.wait_ready(timeout_s=args.server_timeout)
        except ServerStartError as err:
            print(f"error: the server did not start: {err}", file=sys.stderr)
            return 1
        group_of_layer = server_layer_groups(server.url)
        dtype = str(_flag_value(flags, "--dtype"))
        model = load_reference(model_path, DTYPES[dtype])
        if len(group_of_layer) != len(model.model.layers):
            raise SystemExit(
                f"the server's groups cover {len(group_of_layer)} layers, the model has {len(model.model.layers)}"
            )
        for item in tqdm(items, desc="replay", unit="item"):
            text = tokenizer.apply_chat_template(build_messages(item), add_generation_prompt=True, tokenize=False)
            prompt_ids = tokenizer(text, add_special_tokens=False)["input_ids"]
            answer, logprobs, kept = ask(server.url, prompt_ids, args.max_new_tokens, args.request_timeout)
            replays.append(compare_item(model, group_of_layer, item.id, prompt_ids, answer, logprobs, kept))
    finally:
        server.stop()
    lines = summary_lines(replays)
    print("\n".join(lines))
    record = {
        **header,
        "server_args": flags,
        "model_path": model_path,
        "dtype": dtype,
        "items": [asdict(r) for r in replays],
    }
    if args.json:
        Path(args.json).write_text(json.dumps(record, indent=1))
    if args.markdown:
        Path(args.markdown).write_text(
            markdown_header("Kept-set replay in transformers", record) + "\n".join(lines) + "\n"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
