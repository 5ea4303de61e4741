"""StructKV's segment skeleton (pure torch): segment ends, segment ids, whole-segment selection."""

from __future__ import annotations

import os
import secrets

import pytest
import torch

from sglang_pask.structkv import (
    PivotConfig,
    PromptPruning,
    kv_keep,
    pooled_skeleton,
    segment_end_table,
    segment_ids,
    segment_kv_keep,
    segment_skeleton,
    top_count,
)
from sglang_pask.structkv.prefill import DEFAULT_SKELETON_KERNEL


@pytest.fixture
def seed() -> int:
    value = int(os.environ.get("STRUCTKV_TEST_SEED", secrets.randbits(31)))
    print(f"STRUCTKV_TEST_SEED={value}")
    return value


def test_a_token_ends_a_segment_at_a_newline_a_sentence_end_or_a_special_token():
    tokens = [
        b"The",
        b" sky",
        b" is",
        b" blue",
        b".",
        b" Why",
        b"?",
        b"\n\n",
        b"ok",
        b"! ",
        b"3.5",
        b"<|im_end|>",
        b"e.g",
        b"end.\n",
    ]
    table = segment_end_table(tokens, special_ids=[11, 99])
    assert table.tolist() == [
        False,
        False,
        False,
        False,
        True,
        False,
        True,
        True,
        False,
        True,
        False,
        True,
        False,
        True,
    ]


def test_segment_ids_start_a_segment_after_every_end_and_cut_long_ones():
    ends = torch.tensor([0, 0, 1, 0, 1, 1, 0, 0, 0, 0, 0], dtype=torch.bool)
    assert segment_ids(ends, max_len=48).tolist() == [0, 0, 0, 1, 1, 2, 3, 3, 3, 3, 3]
    # The last segment has 5 tokens: pieces of 2 (and the first, 3 tokens, is cut after 2).
    assert segment_ids(ends, max_len=2).tolist() == [0, 0, 1, 2, 2, 3, 4, 4, 5, 5, 6]
    assert segment_ids(torch.zeros(0, dtype=torch.bool)).numel() == 0
    assert segment_ids(torch.zeros(7, dtype=torch.bool), max_len=1).tolist() == list(range(7))


@pytest.mark.parametrize(
    "ends, max_len, message",
    [
        (torch.zeros(3, dtype=torch.int64), 4, "1-D bool"),
        (torch.zeros(2, 3, dtype=torch.bool), 4, "1-D bool"),
        (torch.zeros(3, dtype=torch.bool), 0, "integer >= 1"),
    ],
)
def test_segment_ids_refuse_bad_input(ends, max_len, message):
    with pytest.raises(ValueError, match=message):
        segment_ids(ends, max_len)


def test_the_skeleton_takes_the_window_then_whole_segments_by_mean_score():
    # Segments: [0..3] [4..7] [8..11] [12..15]; the window is the last 2 tokens (14, 15).
    segments = torch.arange(16) // 4
    scores = torch.zeros(16)
    scores[5] = 10.0  # segment 1: one high token, mean 2.5
    scores[8:12] = 3.0  # segment 2: mean 3.0
    scores[0:4] = 1.0  # segment 0: mean 1.0
    skeleton = segment_skeleton(scores, segments, ratio=0.5, window=2)
    assert skeleton.numel() == top_count(0.5, 16) + 2
    assert skeleton.tolist() == [4, 5, 6, 7, 8, 9, 10, 11, 14, 15]


def test_the_last_segment_taken_keeps_its_best_scored_tokens():
    segments = torch.tensor([0, 0, 0, 0, 1, 1, 1, 1, 2, 2])
    scores = torch.tensor([5.0, 5.0, 5.0, 5.0, 0.1, 3.0, 0.2, 2.0, 0.0, 0.0])
    skeleton = segment_skeleton(scores, segments, ratio=0.6, window=2)
    # 6 top tokens: segment 0 whole, then the two best of segment 1 (5 and 7); the window 8, 9.
    assert skeleton.tolist() == [0, 1, 2, 3, 5, 7, 8, 9]


def test_segment_skeleton_size_order_and_ratio_one(seed):
    gen = torch.Generator().manual_seed(seed)
    for _ in range(6):
        n = int(torch.randint(1, 300, (), generator=gen))
        window = int(torch.randint(1, 40, (), generator=gen))
        ratio = float(torch.rand((), generator=gen).clamp(min=0.01))
        ends = torch.rand(n, generator=gen) < 0.1
        segments = segment_ids(ends, max_len=int(torch.randint(1, 30, (), generator=gen)))
        scores = torch.rand(n, generator=gen)
        skeleton = segment_skeleton(scores, segments, ratio, window)
        assert skeleton.numel() == min(n, top_count(ratio, n) + min(window, n)), seed
        assert torch.equal(skeleton, skeleton.unique()), seed
        assert set(range(max(0, n - window), n)) <= set(skeleton.tolist()), seed
        assert segment_skeleton(scores, segments, 1.0, window).tolist() == list(range(n)), seed


def test_segment_skeleton_refuses_mismatched_segments():
    with pytest.raises(ValueError, match="segments must be an int64 tensor of shape"):
        segment_skeleton(torch.rand(5), torch.zeros(4, dtype=torch.int64))
    with pytest.raises(ValueError, match="skeleton ratio"):
        segment_skeleton(torch.rand(5), torch.zeros(5, dtype=torch.int64), ratio=0.0)


def test_a_sentence_singled_out_by_one_token_comes_whole_where_pooled_tokens_lose_its_end(seed):
    """The planted case the segment skeleton exists for: in a long text of sentences, the window
    looks at one word of one sentence (a needle's key) and not at its value, 8 tokens further on
    (nor at anything else near it: the value's pooled score is then the lowest of the text)."""
    gen = torch.Generator().manual_seed(seed)
    n, sentence = 1000, 20
    ends = torch.zeros(n, dtype=torch.bool)
    ends[sentence - 1 :: sentence] = True
    scores = torch.rand(n, generator=gen)
    needle = int(torch.randint(2, n // sentence - 3, (), generator=gen)) * sentence
    key, value = needle + 3, range(needle + 11, needle + 18)
    half_kernel = DEFAULT_SKELETON_KERNEL // 2
    scores[key + 1 : value[-1] + half_kernel + 1] = 0.0
    scores[key] = 50.0
    skeleton = set(segment_skeleton(scores, segment_ids(ends), 0.2, 8).tolist())
    assert set(value) <= skeleton, seed
    assert not set(value) <= set(pooled_skeleton(scores, 0.2, 8).tolist()), seed


def test_prompt_pruning_chooses_its_skeleton_by_segments_when_given_them(seed):
    gen = torch.Generator().manual_seed(seed)
    n, num_layers = 200, 6
    segments = segment_ids(torch.rand(n, generator=gen) < 0.1)
    pruning = PromptPruning(PivotConfig(pivot=2, decay=0.0), num_layers, n, ratio=0.2, window=16, segments=segments)
    layers = [torch.rand(n, generator=gen) for _ in range(3)]
    decision = None
    for layer, scores in enumerate(layers):
        decision = pruning.observe(layer, scores)
    assert decision is not None and decision.decided_at == 2
    assert torch.equal(decision.skeleton, segment_skeleton(layers[2], segments, 0.2, 16)), seed
    with pytest.raises(ValueError, match="segments must be"):
        PromptPruning(PivotConfig(), num_layers, n, 0.2, 8, segments=segments[:-1])


def test_segment_ends_of_a_real_tokenizer_vocabulary(tok, vocab):
    """Through the project's own vocabulary type on the toy tokenizer: ``.`` and newlines end segments."""
    table = segment_end_table(vocab.token_bytes, vocab.special_ids)
    assert table.shape == (len(vocab),)
    ids = tok("The sky is blue. Is it?\nYes<|im_end|>")["input_ids"]
    text = [vocab.token_bytes[i] for i in ids]
    ends = table[torch.tensor(ids)].tolist()
    assert ends == [
        b"\n" in t or t.rstrip().endswith((b".", b"?", b"!")) or i in vocab.special_ids for t, i in zip(text, ids)
    ]
    assert any(ends)


def test_a_group_keeps_whole_segments_of_its_candidates_at_kv_keeps_size(seed):
    gen = torch.Generator().manual_seed(seed)
    for _ in range(6):
        n = int(torch.randint(20, 400, (), generator=gen))
        window = int(torch.randint(1, 12, (), generator=gen))
        segments = segment_ids(torch.rand(n, generator=gen) < 0.08)
        inner = torch.randperm(n - window, generator=gen)[: int(0.3 * n)]
        candidates = torch.cat([inner, torch.arange(n - window, n)]).unique()
        scores = torch.rand(n, generator=gen)
        keep = segment_kv_keep(scores, candidates, segments, 0.1, window)
        assert keep.numel() == kv_keep(scores, candidates, 0.1, window).numel(), seed
        assert set(keep.tolist()) <= set(candidates.tolist()), seed
        assert set(range(n - window, n)) <= set(keep.tolist()), seed
        assert torch.equal(keep, keep.unique()), seed


def test_a_group_ranks_segments_by_the_mean_of_the_tokens_it_computed():
    # Segments of 4: [0..3] [4..7] [8..11] [12..15]; the group computed 0, 1, 5, 6, 7, 9 and the window.
    segments = torch.arange(16) // 4
    candidates = torch.tensor([0, 1, 5, 6, 7, 9, 14, 15])
    scores = torch.zeros(16)
    scores[[0, 1]] = 1.0  # segment 0: mean 1.0 over its candidates
    scores[[2, 3]] = 100.0  # not computed by the group: must not count
    scores[[5, 6, 7]] = 2.0  # segment 1: mean 2.0
    scores[9] = 1.5  # segment 2: mean 1.5
    keep = segment_kv_keep(scores, candidates, segments, ratio=0.25, window=2)
    assert keep.tolist() == [5, 6, 7, 9, 14, 15]
    with pytest.raises(ValueError, match="KV ratio"):
        segment_kv_keep(scores, candidates, segments, ratio=1.5, window=2)
