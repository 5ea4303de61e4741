"""``bench/pivot_profile.py``: the profile of one prompt's layer scores (offline and online pivot)."""

from __future__ import annotations

import torch

from bench.pivot_profile import profile


def test_profile_of_a_planted_transition():
    gen = torch.Generator().manual_seed(5)
    num_layers, n = 12, 200
    hubs = torch.randperm(n, generator=gen)[:10]
    layers = []
    for layer in range(num_layers):
        logits = 0.3 * torch.randn(8, n, generator=gen)
        if layer > 5:
            logits[:, hubs] += 5.0
        layers.append(torch.softmax(logits, dim=-1).sum(dim=0))
    result = profile(layers, window=8)
    assert result["offline_pivot"] == 6
    assert result["online"] == {"pivot": 6, "decided_at": 9}
    assert len(result["transition"]) == len(result["dominance"]) == num_layers - 1
    assert max(result["dominance"]) == result["dominance"][5]
    assert len(result["entropy"]) == num_layers and result["entropy"][6] < result["entropy"][5]
