"""StructKVPass's choice of the KV each layer group keeps: ranked by the group's own window scores
(``--structkv-kv-score own``, the paper's) or by the centrality the skeleton was chosen from
(``centrality``). Pure torch: one request of 40 tokens, four layers, one group per layer, a fixed
pivot at layer 1, so the centrality is layer 1's scores (the sum starts at the pivot)."""

from __future__ import annotations

import pytest
import torch

from sglang_pask.structkv.forward_pass import StructKVPass, StructKVSettings

LENGTH = 40
WINDOW = 2
LAYER_0_FOCUS = range(0, 10)  # what layer 0's window attends
LAYER_1_FOCUS = range(20, 30)  # what layer 1's window (the pivot's, so the centrality) attends


def scores_on(focus: range) -> torch.Tensor:
    """``(LENGTH,)``: 1 on ``focus``, a random 0..0.1 elsewhere (fresh each run)."""
    scores = torch.rand(LENGTH) * 0.1
    scores[list(focus)] = 1.0
    return scores


def decided_pass(kv_score: str) -> StructKVPass:
    settings = StructKVSettings.from_flags("structkv", 1, 0.5, 0.25, WINDOW, 4, "tokens", kv_score)
    prune = StructKVPass(
        settings,
        4,
        [0, 1, 2, 3],
        rows=[0],
        prefix_lens=[0],
        extend_lens=[LENGTH],
        positions=torch.arange(LENGTH),
        out_cache_loc=torch.arange(LENGTH),
    )
    positions = torch.arange(LENGTH)
    prune.add_scores(0, 0, positions, scores_on(LAYER_0_FOCUS))
    prune.add_scores(0, 1, positions, scores_on(LAYER_1_FOCUS))
    assert prune.requests[0].decision is not None and prune.requests[0].decision.pivot == 1
    return prune


@pytest.mark.parametrize("kv_score, focus", [("own", LAYER_0_FOCUS), ("centrality", LAYER_1_FOCUS)])
def test_group_kv_is_ranked_by_its_own_scores_or_by_the_centrality(kv_score, focus):
    prune = decided_pass(kv_score)
    keep = prune.kv_keep(0, 0, range(0, 1)).tolist()  # layer 0 ran on all 40 tokens
    window = list(range(LENGTH - WINDOW, LENGTH))
    assert len(keep) == int(0.25 * LENGTH) + WINDOW and set(window) <= set(keep)
    # Max-pooling over 7 neighbours lets the focus bring up to 3 neighbours on each side.
    chosen = [p for p in keep if p not in window]
    assert all(focus.start - 3 <= p < focus.stop + 3 for p in chosen)
    assert len(set(chosen) & set(focus)) >= 4


def test_centrality_gives_every_group_the_same_ranking():
    prune = decided_pass("centrality")
    assert torch.equal(prune.kv_keep(0, 0, range(0, 1)), prune.kv_keep(0, 1, range(1, 2)))
    own = decided_pass("own")
    assert not torch.equal(own.kv_keep(0, 0, range(0, 1)), own.kv_keep(0, 1, range(1, 2)))


def test_an_unknown_kv_score_is_refused():
    with pytest.raises(ValueError, match="unknown StructKV KV score 'max'"):
        StructKVSettings.from_flags("structkv", "auto", 0.2, 0.1, 8, 32, "segments", "max")


def test_a_prompt_shorter_than_min_prompt_is_served_unpruned_beside_a_pruned_one():
    """--structkv-min-prompt: in one batch, a request whose prompt (cached prefix plus computed tokens)
    reaches the minimum is pruned; the shorter one computes everything, takes no StructKV scores,
    reports nothing and has no StructKV keep set (its KV is the --kv-policy's)."""
    settings = StructKVSettings.from_flags("structkv", 1, 0.5, 0.25, WINDOW, 4, "tokens", "own", min_prompt=LENGTH)
    assert settings.prunes(LENGTH) and not settings.prunes(LENGTH - 1)
    short = LENGTH - 5
    # Request 1 has 5 cached tokens: 5 + 35 = 40 reaches the minimum although it computes only 35.
    prune = StructKVPass(
        settings,
        4,
        [0, 1, 2, 3],
        rows=[0, 1, 2],
        prefix_lens=[0, 0, 5],
        extend_lens=[LENGTH, short, short],
        positions=torch.arange(LENGTH + 2 * short),
        out_cache_loc=torch.arange(LENGTH + 2 * short),
    )
    assert [prune.prunes(i) for i in range(3)] == [True, False, True]
    for layer, focus in ((0, LAYER_0_FOCUS), (1, LAYER_1_FOCUS)):
        prune.add_scores(0, layer, torch.arange(LENGTH), scores_on(focus))
        prune.add_scores(2, layer, torch.arange(5, 5 + short), torch.rand(short))
        assert prune.statistics_queries(1, 8) is None
        with pytest.raises(ValueError, match="request 1 is served unpruned"):
            prune.add_scores(1, layer, torch.arange(short), torch.rand(short))
        prune.after_layer(layer)
    assert prune.requests[0].decision is not None and prune.requests[1].decision is None
    assert all(prune.computed(1, layer) is None for layer in range(4))
    assert prune.report(1) is None and prune.report(0)["pivot"] == 1
    with pytest.raises(ValueError, match="its KV is the --kv-policy's"):
        prune.kv_keep(1, 0, range(0, 1))


def test_min_prompt_zero_prunes_every_prompt():
    settings = StructKVSettings.from_flags("structkv", "auto", 0.2, 0.1, 8, 32, "tokens", "own")
    assert settings.min_prompt == 0 and settings.prunes(1)
