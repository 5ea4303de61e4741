"""``bench/pivot_profile.py``: the profile of one prompt's layer scores (offline and online pivot)."""

from __future__ import annotations

import torch

from bench.pivot_profile import profile


def planted_layers(
    seed: int, hub_range: int, num_layers: int = 12, n: int = 200
) -> tuple[list[torch.Tensor], torch.Tensor]:
    """Window scores ``(n,)`` per layer, diffuse in layers 0-5 and concentrated on 10 hubs (drawn
    among the first ``hub_range`` positions) from layer 6 on; and the hubs ``(10,)``."""
    gen = torch.Generator().manual_seed(seed)
    hubs = torch.randperm(hub_range, generator=gen)[:10]
    layers = []
    for layer in range(num_layers):
        logits = 0.3 * torch.randn(8, n, generator=gen)
        if layer > 5:
            logits[:, hubs] += 5.0
        layers.append(torch.softmax(logits, dim=-1).sum(dim=0))
    return layers, hubs


def test_profile_of_a_planted_transition():
    num_layers = 12
    layers, _ = planted_layers(seed=5, hub_range=200)
    result = profile(layers, window=8, patience=3, dominance=1.5)
    assert result["offline_pivot"] == 6
    assert result["online"] == {"pivot": 6, "decided_at": 9}
    # The default rule settles right after the first dominant step of the range (here a noise step
    # may come first: only 4 steps precede the range of a 12-layer model).
    default = profile(layers, window=8)["online"]
    assert default["decided_at"] == default["pivot"] and 4 <= default["pivot"] <= 6
    assert len(result["stats"]) == num_layers and all(len(row) == 3 for row in result["stats"])
    assert len(result["transition"]) == len(result["dominance"]) == num_layers - 1
    assert max(result["dominance"]) == result["dominance"][5]
    assert len(result["entropy"]) == num_layers and result["entropy"][6] < result["entropy"][5]


def test_skeleton_coverage_of_key_tokens():
    """``skeleton_key_tokens`` counts the key positions in the top 20% (plus the window) by each
    score at the decision layer; planted hubs are all in by every score."""
    layers, hubs = planted_layers(seed=7, hub_range=192)
    result = profile(layers, window=8, patience=3, dominance=1.5, key_positions=hubs.tolist() + [0, 1])
    coverage = result["skeleton_key_tokens"]
    assert coverage["key_tokens"] == 12
    assert all(10 <= coverage[name] <= 12 for name in ("from_layer_0", "from_search_start", "layer_alone"))
    assert profile(layers, window=8)["skeleton_key_tokens"] is None


def test_retrieval_onset_is_the_first_layer_whose_own_skeleton_holds_every_key_token():
    """Hubs planted from layer 6 on: each layer's own pooled top 20% holds all ten from there, and
    (by chance) not all ten before."""
    layers, hubs = planted_layers(seed=11, hub_range=392, n=400)
    result = profile(layers, window=8, key_positions=hubs.tolist())
    assert result["layer_key_tokens"][6:] == [10] * 6
    assert all(held < 10 for held in result["layer_key_tokens"][:6])
    assert result["retrieval_onset"] == 6
    assert profile(layers, window=8)["retrieval_onset"] is None


def test_window_score_recorder_equals_eager_attention_maps():
    """The recorder's window scores equal eager attention's maps of the same (random, tiny) Qwen2
    model, summed over heads and the last ``window`` queries, its statistics' scores the same over
    the last ``statistics_window``; the model's output is unchanged."""
    from transformers import Qwen2Config, Qwen2ForCausalLM
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    from bench.pivot_profile import WindowScoreRecorder

    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=128,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
    )
    ids = torch.randint(0, 128, (1, 50))
    eager = Qwen2ForCausalLM._from_config(config, attn_implementation="eager").eval()
    with torch.no_grad():
        reference = eager(ids, output_attentions=True)
    original = ALL_ATTENTION_FUNCTIONS["sdpa"]
    recorder = WindowScoreRecorder(original, window=6, statistics_window=2)
    ALL_ATTENTION_FUNCTIONS["sdpa"] = recorder
    try:
        sdpa = Qwen2ForCausalLM._from_config(config, attn_implementation="sdpa").eval()
        sdpa.load_state_dict(eager.state_dict())
        with torch.no_grad():
            logits = sdpa(ids).logits
    finally:
        ALL_ATTENTION_FUNCTIONS["sdpa"] = original
    assert len(recorder.scores) == len(recorder.statistics) == 3
    for recorded, statistics, attention in zip(recorder.scores, recorder.statistics, reference.attentions):
        torch.testing.assert_close(recorded, attention[0, :, -6:, :].sum(dim=(0, 1)), rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(statistics, attention[0, :, -2:, :].sum(dim=(0, 1)), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(logits, reference.logits, rtol=1e-4, atol=1e-4)


def test_skeleton_coverage_by_pooled_tokens_and_by_segments():
    """Each score's coverage is also reported through the prefill's two selections (pooled tokens,
    whole segments); each layer's own skeleton follows ``layers_by_segments``."""
    from sglang_pask.structkv import pooled_skeleton, segment_ids, segment_skeleton

    layers, hubs = planted_layers(seed=3, hub_range=192)
    n = layers[0].numel()
    ends = torch.zeros(n, dtype=torch.bool)
    ends[9::10] = True  # sentences of 10 tokens
    segments = segment_ids(ends)
    keys = hubs.tolist()
    result = profile(layers, window=8, patience=3, dominance=1.5, key_positions=keys, segments=segments)
    coverage, decided = result["skeleton_key_tokens"], result["online"]["decided_at"]
    alone = layers[decided]
    assert coverage["layer_alone_pooled"] == len(set(keys) & set(pooled_skeleton(alone, 0.2, 8).tolist()))
    assert coverage["layer_alone_segments"] == len(set(keys) & set(segment_skeleton(alone, segments, 0.2, 8).tolist()))
    assert {
        f"{name}_{how}"
        for name in ("from_layer_0", "from_search_start", "layer_alone")
        for how in ("pooled", "segments")
    } <= set(coverage)
    by_tokens = profile(layers, window=8, key_positions=keys, segments=segments, layers_by_segments=False)
    assert by_tokens["layer_key_tokens"] == [len(set(keys) & set(pooled_skeleton(s, 0.2, 8).tolist())) for s in layers]
    assert result["layer_key_tokens"] == [
        len(set(keys) & set(segment_skeleton(s, segments, 0.2, 8).tolist())) for s in layers
    ]
