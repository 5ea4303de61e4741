"""``python -m sglang_pask.inspect``: a prompt and its completion coloured by structural role.

Sends one greedy request with ``return_kv_roles`` and ``return_kv_kept`` to a running server and
shows every prompt and output token on a background colour that names its role, in the terminal
and, with ``--html``, as a self-contained HTML page (hover a token for its role, id and its tier in
each layer group). Each layer group holds a token in one of three tiers when the request ends: in
full precision, at low bits (``--kv-dropped 2bit|k4v2``) or evicted. In the terminal a token evicted
by every group is struck through and one some group holds at low bits is underlined; in the page a
token fades by the share of groups that do not hold it in full (low bits count half). A legend counts
the tokens per role and, per layer group, how many of them it holds in full and at low bits.

    python -m sglang_pask.inspect --messages chat.json --tools tools.json --json-schema schema.json --html roles.html
    python -m sglang_pask.inspect --prompt "SQL for all users: " --ebnf sql.ebnf
"""

from __future__ import annotations

import argparse
import html
import json
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional, Sequence

from sglang_pask.cli_paths import output_file
from sglang_pask.structure import LABELS

# One colour per role label (RGB), chosen so neighbouring roles differ.
ROLE_COLOURS: dict[str, tuple[int, int, int]] = {
    "whitespace": (230, 230, 230),
    "boundary": (190, 190, 190),
    "free_text": (250, 250, 210),
    "func_name": (255, 120, 120),
    "arg_key": (255, 190, 90),
    "required_key": (255, 150, 40),
    "value_string": (140, 210, 255),
    "value_number": (120, 170, 255),
    "value_bool": (180, 150, 255),
    "value_null": (200, 200, 255),
    "value_enum": (120, 230, 200),
    "template": (160, 160, 160),
    "system_text": (220, 240, 200),
    "user_question": (150, 240, 150),
    "schema_func_name": (255, 120, 200),
    "schema_param_name": (255, 170, 220),
    "schema_required": (255, 100, 160),
    "schema_type": (230, 200, 255),
    "schema_enum": (160, 230, 230),
    "schema_description": (240, 225, 200),
    "schema_example": (250, 200, 120),
}


FULL, LOW_BIT, EVICTED = "full", "low-bit", "evicted"
# One letter per tier in the plain terminal rendering.
TIER_LETTERS = {FULL: "F", LOW_BIT: "L", EVICTED: "-"}


@dataclass(frozen=True)
class TaggedToken:
    """One token: its id, its text, its role label, whether it is part of the prompt, and per layer
    group its tier when the request ended (:data:`FULL`, :data:`LOW_BIT` or :data:`EVICTED`; None if
    the server did not say: not an sglang-pask server, or the token was never written, as the last
    one sampled)."""

    token_id: int
    text: str
    role: str
    in_prompt: bool
    tiers: Optional[tuple[str, ...]] = None

    @property
    def dropped_everywhere(self) -> bool:
        """Whether every layer group evicted the token."""
        return self.tiers is not None and all(tier == EVICTED for tier in self.tiers)

    @property
    def low_bit_somewhere(self) -> bool:
        """Whether some layer group holds the token at low bits."""
        return self.tiers is not None and LOW_BIT in self.tiers

    @property
    def held_share(self) -> float:
        """The share of groups holding the token in full, low bits counting half (1.0 when unknown)."""
        if self.tiers is None:
            return 1.0
        return sum({FULL: 1.0, LOW_BIT: 0.5}.get(tier, 0.0) for tier in self.tiers) / len(self.tiers)

    def tier_note(self) -> str:
        """``"full in 0, 2; low-bit in 1; evicted in 3 (of 4 layer groups)"``; empty if unknown."""
        if self.tiers is None:
            return ""
        parts = []
        for tier in (FULL, LOW_BIT, EVICTED):
            groups = [str(g) for g, held in enumerate(self.tiers) if held == tier]
            if groups:
                parts.append(f"{tier} in {', '.join(groups)}")
        return "; ".join(parts) + f" (of {len(self.tiers)} layer groups)"


def _colour(role: str) -> tuple[int, int, int]:
    return ROLE_COLOURS.get(role, (255, 255, 255))


def render_terminal(tokens: Sequence[TaggedToken], colour: bool = True) -> str:
    """The tokens as terminal text (24-bit background colours), then a legend with counts."""
    parts: list[str] = []
    for index, token in enumerate(tokens):
        if index > 0 and token.in_prompt != tokens[index - 1].in_prompt:
            parts.append("\n--- completion ---\n")
        if colour:
            r, g, b = _colour(token.role)
            mark = "\x1b[9m" if token.dropped_everywhere else "\x1b[4m" if token.low_bit_somewhere else ""
            parts.append(f"\x1b[48;2;{r};{g};{b}m\x1b[38;2;0;0;0m{mark}{token.text}\x1b[0m")
        else:
            full = token.tiers is None or all(tier == FULL for tier in token.tiers)
            tiers = "" if full else "|tiers:" + "".join(TIER_LETTERS[tier] for tier in token.tiers or ())
            parts.append(f"[{token.text}|{token.role}{tiers}]")
    legend = []
    for role, count in sorted(Counter(t.role for t in tokens).items(), key=lambda item: LABELS.index(item[0])):
        r, g, b = _colour(role)
        swatch = f"\x1b[48;2;{r};{g};{b}m  \x1b[0m " if colour else ""
        legend.append(f"{swatch}{role}: {count}")
    dropped = sum(t.dropped_everywhere for t in tokens)
    low_bit = sum(t.low_bit_somewhere for t in tokens)
    notes = []
    if dropped:
        notes.append(f"{dropped} tokens evicted by every layer group" + (" (struck through)" if colour else ""))
    if low_bit:
        notes.append(f"{low_bit} tokens at low bits in some layer group" + (" (underlined)" if colour else ""))
    note = "".join("\n" + line for line in notes)
    return "".join(parts) + "\n\n" + "  ".join(legend) + note + "\n"


def render_html(tokens: Sequence[TaggedToken], title: str) -> str:
    """A self-contained HTML page: prompt and completion, one coloured span per token, and a legend."""

    def span(token: TaggedToken) -> str:
        r, g, b = _colour(token.role)
        note = token.tier_note()
        tip = html.escape(f"{token.role} (id {token.token_id})" + (f", {note}" if note else ""))
        text = html.escape(token.text).replace("\n", "↵<br>")
        fade = "" if token.tiers is None else f";opacity:{0.2 + 0.8 * token.held_share:.2f}"
        mark = (
            ";text-decoration:line-through"
            if token.dropped_everywhere
            else ";text-decoration:underline dotted"
            if token.low_bit_somewhere
            else ""
        )
        return f'<span class="t" style="background:rgb({r},{g},{b}){fade}{mark}" title="{tip}">{text}</span>'

    prompt = "".join(span(t) for t in tokens if t.in_prompt)
    completion = "".join(span(t) for t in tokens if not t.in_prompt)
    counts = Counter(t.role for t in tokens)
    num_groups = max((len(t.tiers) for t in tokens if t.tiers is not None), default=0)

    def held(tier: str) -> list[Counter]:
        return [
            Counter(t.role for t in tokens if t.tiers is not None and t.tiers[g] == tier) for g in range(num_groups)
        ]

    full, low_bit = held(FULL), held(LOW_BIT)
    legend = "".join(
        f'<tr><td><span class="t" style="background:rgb{_colour(role)}">{role}</span></td><td>{counts[role]}</td>'
        + "".join(f"<td>{f[role]} / {q[role]}</td>" for f, q in zip(full, low_bit))
        + "</tr>"
        for role in LABELS
        if counts[role]
    )
    group_heads = "".join(f"<th>group {g}: full / low-bit</th>" for g in range(num_groups))
    return f"""<!doctype html>
<html><head><meta charset="utf-8"><title>{html.escape(title)}</title>
<style>
body {{ font-family: sans-serif; margin: 2em; max-width: 70em; }}
.tokens {{ font-family: monospace; white-space: pre-wrap; line-height: 1.9; border: 1px solid #ccc; padding: 1em; }}
.t {{ border-radius: 3px; padding: 1px 0; margin-right: 1px; }}
table {{ border-collapse: collapse; }} td {{ padding: 2px 10px; }}
</style></head><body>
<h1>{html.escape(title)}</h1>
<h2>Prompt ({sum(t.in_prompt for t in tokens)} tokens)</h2><div class="tokens">{prompt}</div>
<h2>Completion ({sum(not t.in_prompt for t in tokens)} tokens)</h2><div class="tokens">{completion}</div>
<h2>Roles</h2><table><tr><th>role</th><th>tokens</th>{group_heads}</tr>{legend}</table>
</body></html>
"""


def _read_json_arg(value: str) -> Any:
    """JSON given inline or as a path to a file."""
    path = Path(value)
    text = path.read_text() if path.is_file() else value
    try:
        return json.loads(text)
    except json.JSONDecodeError as err:
        raise SystemExit(f"error: not valid JSON (inline or file): {value[:80]!r}: {err}") from None


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m sglang_pask.inspect",
        description="Show a prompt and its completion coloured by structural role (terminal and HTML).",
    )
    parser.add_argument("--url", default="http://127.0.0.1:30000", help="server address (default: %(default)s)")
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--prompt", help="raw prompt text")
    source.add_argument(
        "--messages", help="chat messages (JSON list, inline or a file); the model's chat template is applied"
    )
    parser.add_argument("--tools", help="OpenAI tools (JSON list, inline or a file) rendered by the chat template")
    grammar = parser.add_mutually_exclusive_group()
    grammar.add_argument("--json-schema", help="JSON schema constraint (inline or a file)")
    grammar.add_argument("--regex", help="regex constraint")
    grammar.add_argument("--ebnf", help="EBNF grammar constraint (a file, or the grammar text)")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--html", type=lambda text: Path(output_file(text)), help="also write the coloured page here")
    parser.add_argument("--no-color", action="store_true", help="terminal output as [token|role] text")
    return parser


def _sampling_params(args: argparse.Namespace) -> dict[str, Any]:
    params: dict[str, Any] = {
        "temperature": 0,
        "max_new_tokens": args.max_new_tokens,
        "return_kv_roles": True,
        "return_kv_kept": True,
    }
    if args.json_schema:
        params["json_schema"] = json.dumps(_read_json_arg(args.json_schema))
    elif args.regex:
        params["regex"] = args.regex
    elif args.ebnf:
        path = Path(args.ebnf)
        params["ebnf"] = path.read_text() if path.is_file() else args.ebnf
    return params


def collect(url: str, prompt: str, sampling_params: dict[str, Any], tokenizer: Any) -> list[TaggedToken]:
    """Send the request and pair every prompt and output token with its role."""
    import requests

    response = requests.post(f"{url}/generate", json={"text": prompt, "sampling_params": sampling_params}, timeout=600)
    if response.status_code != 200:
        raise SystemExit(f"error: the server answered {response.status_code}: {response.text[:500]}")
    body = response.json()
    meta = body["meta_info"]
    prompt_ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    if len(prompt_ids) != len(meta["kv_prompt_roles"]):
        raise SystemExit(
            f"error: the local tokenizer gives {len(prompt_ids)} prompt tokens, the server "
            f"{len(meta['kv_prompt_roles'])}; is --url serving the model this tokenizer belongs to?"
        )
    stats = meta.get("kv_stats", {})
    tiers = tiers_by_position(
        stats.get("kept_positions"), stats.get("lowbit_positions"), len(prompt_ids) + len(body["output_ids"])
    )
    tokens = [
        TaggedToken(t, tokenizer.decode([t]), role, True, tiers[i])
        for i, (t, role) in enumerate(zip(prompt_ids, meta["kv_prompt_roles"]))
    ]
    tokens += [
        TaggedToken(t, tokenizer.decode([t]), role, False, tiers[len(prompt_ids) + i])
        for i, (t, role) in enumerate(zip(body["output_ids"], meta["kv_roles"]))
    ]
    return tokens


def tiers_by_position(
    kept_positions: Optional[list[list[int]]], lowbit_positions: Optional[list[list[int]]], length: int
) -> list[Optional[tuple[str, ...]]]:
    """``(length,)``: per position, its tier in each layer group, from ``kv_stats.kept_positions`` and
    (under a low-bit ``--kv-dropped`` mode) ``kv_stats.lowbit_positions``.

    Positions past the last one any group read (the last sampled token, never written) and every
    position when the server reported nothing get None."""
    if not kept_positions:
        return [None] * length
    full = [set(group) for group in kept_positions]
    low = [set(group) for group in lowbit_positions] if lowbit_positions else [set() for _ in full]
    written = max((max(group) for group in (*kept_positions, *(lowbit_positions or [])) if group), default=-1) + 1
    return [
        tuple(FULL if p in f else LOW_BIT if p in q else EVICTED for f, q in zip(full, low)) if p < written else None
        for p in range(length)
    ]


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    import requests
    from transformers import AutoTokenizer

    try:
        model_path = requests.get(f"{args.url}/model_info", timeout=30).json()["model_path"]
    except requests.RequestException as err:
        print(f"error: no server at {args.url}: {err}", file=sys.stderr)
        return 1
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    if args.messages:
        tools = _read_json_arg(args.tools) if args.tools else None
        prompt = tokenizer.apply_chat_template(
            _read_json_arg(args.messages), tools=tools, tokenize=False, add_generation_prompt=True
        )
    else:
        prompt = args.prompt
    tokens = collect(args.url, prompt, _sampling_params(args), tokenizer)
    sys.stdout.write(render_terminal(tokens, colour=not args.no_color and sys.stdout.isatty()))
    if args.html:
        args.html.write_text(render_html(tokens, f"Structural roles: {len(tokens)} tokens"))
        print(f"wrote {args.html}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
