"""The layer-group KV pool, allocator, views and attention backend, in process on small shapes.

Real SGLang classes (its MHA pool, token allocator and torch_native backend) with sglang-pask's
layer-group subclasses; the model runner and forward batch are minimal stand-ins carrying only the
fields the backend reads.
"""

from __future__ import annotations

import os

os.environ.setdefault("SGLANG_USE_CPU_ENGINE", "1")

from types import SimpleNamespace  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402
from sglang.srt.layers.attention.torch_native_backend import TorchNativeAttnBackend  # noqa: E402
from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool  # noqa: E402

from sglang_pask.config import KV_POLICIES  # noqa: E402
from sglang_pask.kvpool.compression import KVViewTable  # noqa: E402
from sglang_pask.kvpool.probe import ALL_GROUPS, ALL_ROLES, CalibrationProbe  # noqa: E402
from sglang_pask.kvpool.sizing import LayerGroupLayout, group_slot_counts, virtual_slot_count  # noqa: E402
from sglang_pask.policy import PaskTable, available_policies, capacity, get_policy  # noqa: E402
from sglang_pask.srt.admission import LayerGroupPrefillBudget  # noqa: E402
from sglang_pask.srt.attention.torch_native import LayerGroupTorchNativeAttnBackend  # noqa: E402
from sglang_pask.srt.pool import LayerGroupAllocator, LayerGroupMHAKVPool  # noqa: E402
from sglang_pask.structure.roles import Role  # noqa: E402

Q_HEADS, KV_HEADS, HEAD_DIM, LAYERS = 4, 2, 8, 2
SLOTS, ROWS, CONTEXT = 256, 8, 128


def make_pool(pool_class=LayerGroupMHAKVPool, dtype=torch.float32, layers=LAYERS, **layout):
    return pool_class(
        SLOTS,
        page_size=1,
        dtype=dtype,
        head_num=KV_HEADS,
        head_dim=HEAD_DIM,
        layer_num=layers,
        device="cpu",
        enable_memory_saver=False,
        **layout,
    )


def grouped_layout(budgets, group_slots=None, layers=LAYERS):
    """One layer per group unless ``layers`` says otherwise; ``group_slots`` defaults to ``P`` each."""
    per_group = layers // len(budgets)
    ranges = tuple(range(g * per_group, (g + 1) * per_group) for g in range(len(budgets)))
    slots = tuple(group_slots or [SLOTS] * len(budgets))
    return LayerGroupLayout(ranges, SLOTS, slots, virtual_slot_count(slots, budgets))


def make_grouped(
    policy: str = "snapkv",
    budget: float = 0.33,
    window: int = 4,
    roles_of=None,
    budgets=None,
    group_slots=None,
    score_window=None,
    compress_decode=True,
    probe_of=None,
    **options,
):
    """A layer-group pool (one layer per group), its allocator and view table, and req_to_token."""
    if budgets is None:
        budgets = [1.0, 1.0] if policy == "full" else [budget, budget]
    pool = make_pool(layout=grouped_layout(budgets, group_slots))
    allocator = LayerGroupAllocator(
        pool, torch.float32, "cpu", need_sort=False, budgets=budgets, compress_decode=compress_decode
    )
    req_to_token = torch.zeros((ROWS, CONTEXT), dtype=torch.int32)

    def drop(row, group, positions):
        allocator.drop(group, req_to_token[row, positions])

    def holds(row, group, positions):
        return pool.physical(group, req_to_token[row, positions]) > 0

    pool.views = KVViewTable(
        get_policy(policy, **options),
        budgets,
        window,
        drop,
        slack=2,
        roles_of=roles_of,
        score_window=score_window,
        compress_decode=compress_decode,
        probe_of=probe_of,
        holds=holds,
    )
    return pool, allocator, req_to_token


def layer(layer_id: int) -> SimpleNamespace:
    return SimpleNamespace(
        layer_id=layer_id,
        tp_q_head_num=Q_HEADS,
        tp_k_head_num=KV_HEADS,
        qk_head_dim=HEAD_DIM,
        v_head_dim=HEAD_DIM,
        scaling=HEAD_DIM**-0.5,
        is_cross_attention=False,
        sliding_window_size=-1,
        attn_type=None,
    )


def backend_for(pool, req_to_token, backend_class=LayerGroupTorchNativeAttnBackend):
    runner = SimpleNamespace(
        device="cpu", req_to_token_pool=SimpleNamespace(req_to_token=req_to_token), token_to_kv_pool=pool
    )
    return backend_class(runner)


def forward_batch(rows, seq_lens, extend_lens, out_cache_loc, decode=False):
    return SimpleNamespace(
        forward_mode=SimpleNamespace(is_decode=lambda: decode),
        req_pool_indices=torch.tensor(rows),
        seq_lens=torch.tensor(seq_lens),
        seq_lens_cpu=torch.tensor(seq_lens),
        extend_seq_lens_cpu=list(extend_lens),
        extend_prefix_lens=torch.tensor([n - e for n, e in zip(seq_lens, extend_lens)]),
        extend_seq_lens=torch.tensor(extend_lens),
        encoder_lens=None,
        out_cache_loc=out_cache_loc,
    )


def run_layers(backend, batch, tokens: int, generator, decode=False):
    """Run every layer once with random q/k/v; returns ((layer, q, k, v, output), ...)."""
    backend.init_forward_metadata(batch)
    results = []
    for layer_id in range(LAYERS):
        q = torch.randn(tokens, Q_HEADS * HEAD_DIM, generator=generator)
        k = torch.randn(tokens, KV_HEADS, HEAD_DIM, generator=generator)
        v = torch.randn(tokens, KV_HEADS, HEAD_DIM, generator=generator)
        run = backend.forward_decode if decode else backend.forward_extend
        results.append((layer_id, q, k, v, run(q, k, v, layer(layer_id), batch)))
    return results


def decode_steps(backend, allocator, req_to_token, row: int, length: int, steps: int, generator) -> int:
    """Decode ``steps`` tokens for ``row`` (one slot each, every layer run); returns the new length."""
    for _ in range(steps):
        step = allocator.alloc(1)
        req_to_token[row, length] = step
        length += 1
        run_layers(backend, forward_batch([row], [length], [1], step, decode=True), 1, generator, decode=True)
    return length


def test_config_lists_every_registered_policy():
    assert set(KV_POLICIES) == set(available_policies())


def test_alloc_free_and_drop_conserve_every_group():
    pool, allocator, _ = make_grouped()
    ids = allocator.alloc(40)
    assert ids is not None and allocator.available_size() == SLOTS - 40
    assert allocator.drop(1, ids[:30]) == 30
    assert allocator.drop(1, ids[:30]) == 0  # already gone
    assert allocator.group_used_slots(0) == 40 and allocator.group_used_slots(1) == 10
    assert (pool.physical(1, ids[:30]) == 0).all() and (pool.physical(0, ids) > 0).all()
    assert allocator.check_slots() == []
    allocator.free(ids)
    assert allocator.available_size() == SLOTS
    assert allocator.virtual_available_size() == pool.layout.virtual_slots
    assert allocator.check_slots() == [] and int(pool.group_loc.count_nonzero()) == 0


def test_alloc_is_all_or_nothing_when_a_group_is_full():
    pool, allocator, _ = make_grouped()
    first = allocator.alloc(SLOTS)
    assert first is not None
    allocator.drop(0, first[:100])  # group 0 has room again, group 1 does not
    assert allocator.alloc(10) is None
    assert allocator.group_used_slots(0) == SLOTS - 100 and allocator.group_used_slots(1) == SLOTS
    assert allocator.virtual_available_size() == pool.layout.virtual_slots - SLOTS
    assert allocator.check_slots() == []


def test_free_group_defers_until_end():
    _, allocator, _ = make_grouped()
    ids = allocator.alloc(8)
    allocator.free_group_begin()
    allocator.free(ids)
    assert allocator.available_size() == SLOTS - 8
    allocator.free_group_end()
    assert allocator.available_size() == SLOTS and allocator.check_slots() == []


def test_budget_one_reads_exactly_what_stock_sglang_reads():
    """Policy full: the layer-group backend's outputs are bitwise the stock backend's, extend and decode."""
    grouped_pool, allocator, grouped_r2t = make_grouped("full")
    stock_pool = make_pool(MHATokenToKVPool)
    stock_r2t = torch.zeros_like(grouped_r2t)
    grouped = backend_for(grouped_pool, grouped_r2t)
    stock = backend_for(stock_pool, stock_r2t, TorchNativeAttnBackend)
    ids = allocator.alloc(23)
    grouped_r2t[1, :13], grouped_r2t[2, :10] = ids[:13], ids[13:]
    stock_r2t[1, :13], stock_r2t[2, :10] = ids[:13], ids[13:]
    batch = forward_batch([1, 2], [13, 10], [13, 10], ids)
    seed = 0
    for current, extend in ((grouped, True), (stock, True)):
        outputs = run_layers(current, batch, 23, torch.Generator().manual_seed(seed))
        current.last = [out for *_, out in outputs]
    assert all(torch.equal(a, b) for a, b in zip(grouped.last, stock.last))
    step = allocator.alloc(2)
    grouped_r2t[1, 13], grouped_r2t[2, 10] = step
    stock_r2t[1, 13], stock_r2t[2, 10] = step
    decode = forward_batch([1, 2], [14, 11], [1, 1], step, decode=True)
    a = run_layers(grouped, decode, 2, torch.Generator().manual_seed(1), decode=True)
    b = run_layers(stock, decode, 2, torch.Generator().manual_seed(1), decode=True)
    assert all(torch.equal(x[-1], y[-1]) for x, y in zip(a, b))


def write_prefix(pool, allocator, length: int, generator):
    """Allocate and write a prefix's K/V in every layer (as a cached, shared prefix)."""
    ids = allocator.alloc(length)
    for layer_id in range(LAYERS):
        k = torch.randn(length, KV_HEADS, HEAD_DIM, generator=generator)
        pool.set_kv_buffer(layer(layer_id), ids, k, torch.randn(length, KV_HEADS, HEAD_DIM, generator=generator))
    return ids


def test_private_eviction_never_touches_a_shared_prefix():
    """Two requests share a cached prefix; both compress their private tokens after prefill. The
    prefix keeps every slot in every group, bitwise."""
    pool, allocator, req_to_token = make_grouped("snapkv", 0.33)
    backend = backend_for(pool, req_to_token)
    generator = torch.Generator().manual_seed(3)
    prefix = write_prefix(pool, allocator, 20, generator)
    physical_before = pool.group_loc[:, prefix].clone()
    kv_before = [
        (pool.get_key_buffer(i)[physical_before[i]].clone(), pool.get_value_buffer(i)[physical_before[i]].clone())
        for i in range(LAYERS)
    ]
    private = allocator.alloc(60)
    for row, ids in ((1, private[:30]), (2, private[30:])):
        req_to_token[row, :20] = prefix
        req_to_token[row, 20:50] = ids
    used_before = [allocator.group_used_slots(g) for g in range(2)]
    run_layers(backend, forward_batch([1, 2], [50, 50], [30, 30], private), 60, generator)
    assert torch.equal(pool.group_loc[:, prefix], physical_before)
    for i in range(LAYERS):
        assert torch.equal(pool.get_key_buffer(i)[physical_before[i]], kv_before[i][0])
        assert torch.equal(pool.get_value_buffer(i)[physical_before[i]], kv_before[i][1])
    for g in range(2):
        kept = pool.views.views[1].groups[g].kept
        assert kept is not None and (kept[:20] == torch.arange(20)).all()
        # The row's budget, floor(0.33 * 50) = 16, is spent by the 20 prefix tokens held in full, so
        # each request keeps only the 4-token window of its 30 private tokens; the rest went back.
        assert kept.numel() == 20 + 4
        assert allocator.group_used_slots(g) == used_before[g] - 2 * (30 - 4)
    assert allocator.check_slots() == []


def test_a_prompt_in_two_passes_keeps_as_many_tokens_as_in_one():
    """The budget is the row's: a prompt of 60 keeps floor(0.33 * 60) = 19 per group, in one pass or in
    two of 30 (9, then 19 - 9 = 10), not a budget and a window per pass."""
    pool, allocator, req_to_token = make_grouped("snapkv", 0.33)
    backend = backend_for(pool, req_to_token)
    generator = torch.Generator().manual_seed(8)
    ids = allocator.alloc(120)
    req_to_token[1, :60], req_to_token[2, :60] = ids[:60], ids[60:]
    run_layers(backend, forward_batch([1], [60], [60], ids[:60]), 60, generator)
    run_layers(backend, forward_batch([2], [30], [30], ids[60:90]), 30, generator)
    assert all(pool.views.views[2].groups[g].kept.numel() == 9 for g in range(2))
    run_layers(backend, forward_batch([2], [60], [30], ids[90:]), 30, generator)
    for g in range(2):
        assert pool.views.views[1].groups[g].kept.numel() == 19
        assert pool.views.views[2].groups[g].kept.numel() == 19
        assert (pool.physical(g, req_to_token[2, :60]) > 0).sum() == 19
    assert allocator.check_slots() == []


def test_sinks_in_a_matched_prefix_take_no_capacity_from_the_rest():
    """streaming-llm's 4 sinks are kept when they are candidates (one pass: max(floor(0.05 * 60), 4 + 4)
    = 8); after a 10-token prefix they are not candidates, and the prefix's 10 held tokens exceed the
    row's budget, so the rest keeps its window only."""
    pool, allocator, req_to_token = make_grouped("streaming-llm", 0.05)
    backend = backend_for(pool, req_to_token)
    generator = torch.Generator().manual_seed(9)
    prefix = write_prefix(pool, allocator, 10, generator)
    ids = allocator.alloc(110)
    req_to_token[1, :60] = ids[:60]
    req_to_token[2, :10], req_to_token[2, 10:60] = prefix, ids[60:]
    run_layers(backend, forward_batch([1, 2], [60, 60], [60, 50], torch.cat((ids[:60], ids[60:]))), 110, generator)
    for g in range(2):
        assert pool.views.views[1].groups[g].kept.tolist() == [0, 1, 2, 3, 56, 57, 58, 59]
        assert pool.views.views[2].groups[g].kept.tolist() == list(range(10)) + [56, 57, 58, 59]
    assert allocator.check_slots() == []


def test_attention_over_the_kept_set_equals_attention_with_evicted_tokens_masked():
    pool, allocator, req_to_token = make_grouped("snapkv", 0.33)
    backend = backend_for(pool, req_to_token)
    generator = torch.Generator().manual_seed(5)
    ids = allocator.alloc(40)
    req_to_token[1, :40] = ids
    extend = run_layers(backend, forward_batch([1], [40], [40], ids), 40, generator)
    full_k = {layer_id: k for layer_id, _, k, _, _ in extend}
    full_v = {layer_id: v for layer_id, _, _, v, _ in extend}
    step = allocator.alloc(1)
    req_to_token[1, 40] = step
    decode = run_layers(backend, forward_batch([1], [41], [1], step, decode=True), 1, generator, decode=True)
    for layer_id, q, k, v, output in decode:
        view = pool.views.views[1].groups[layer_id]
        keys = torch.cat((full_k[layer_id], k)).float()
        values = torch.cat((full_v[layer_id], v)).float()
        read = torch.zeros(41, dtype=torch.bool)
        read[view.positions(41, torch.device("cpu"))] = True
        assert 4 <= int(read.sum()) < 41  # something was evicted, the window stayed
        queries = q.view(Q_HEADS, HEAD_DIM)
        expanded_k = keys.repeat_interleave(Q_HEADS // KV_HEADS, dim=1)
        expanded_v = values.repeat_interleave(Q_HEADS // KV_HEADS, dim=1)
        logits = torch.einsum("hd,lhd->hl", queries, expanded_k) * HEAD_DIM**-0.5
        weights = torch.softmax(logits.masked_fill(~read[None, :], float("-inf")), dim=-1)
        reference = torch.einsum("hl,lhd->hd", weights, expanded_v).reshape(1, -1)
        torch.testing.assert_close(output, reference, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("policy", ["streaming-llm", "h2o", "snapkv", "pyramidkv"])
def test_every_policy_compresses_private_tokens_to_its_capacity(policy):
    pool, allocator, req_to_token = make_grouped(policy, 0.5)
    backend = backend_for(pool, req_to_token)
    generator = torch.Generator().manual_seed(7)
    ids = allocator.alloc(32)
    req_to_token[3, :32] = ids
    run_layers(backend, forward_batch([3], [32], [32], ids), 32, generator)
    for g in range(2):
        assert pool.views.views[3].groups[g].kept.numel() == 16
        assert allocator.group_used_slots(g) == 16
    # Decode: private decode tokens are compressed once they pass capacity + slack.
    length = decode_steps(backend, allocator, req_to_token, 3, 32, 12, generator)
    assert pool.views.views[3].shared_upto == 32
    for g in range(2):
        private = pool.views.views[3].groups[g].positions(length, torch.device("cpu"))
        private = private[private >= 32]
        # At most capacity + slack (the policy runs once the private tokens pass that).
        assert private.numel() <= capacity(0.5, 12, 4, get_policy(policy).reserved_tokens) + 2
        assert (private[-4:] == torch.arange(length - 4, length)).all()
    allocator.free(req_to_token[3, :length].long())
    pool.views.release(3)
    assert allocator.available_size() == SLOTS and allocator.check_slots() == []


@pytest.mark.parametrize("policy", ["snapkv", "streaming-llm"])
def test_kv_decode_keep_compresses_the_prompt_and_keeps_every_generated_token(policy):
    pool, allocator, req_to_token = make_grouped(policy, 0.5, compress_decode=False)
    backend = backend_for(pool, req_to_token)
    generator = torch.Generator().manual_seed(11)
    ids = allocator.alloc(32)
    req_to_token[3, :32] = ids
    run_layers(backend, forward_batch([3], [32], [32], ids), 32, generator)
    assert [allocator.group_used_slots(g) for g in range(2)] == [16, 16]  # the prompt: compressed as ever
    decode_scores = []
    pool.views.add_scores = lambda *args: decode_scores.append(args)
    length = decode_steps(backend, allocator, req_to_token, 3, 32, 12, generator)
    assert decode_scores == []  # nothing would read them: decode scores nothing
    for g in range(2):
        held = pool.views.views[3].groups[g].positions(length, torch.device("cpu"))
        assert (held[held >= 32] == torch.arange(32, length)).all()  # all 12 generated tokens
        assert allocator.group_used_slots(g) == 16 + 12
    assert allocator.decode_growth(0, 100) == 100  # admission charges every generated token
    allocator.free(req_to_token[3, :length].long())
    pool.views.release(3)
    assert allocator.available_size() == SLOTS and allocator.check_slots() == []


def run_probe(probe: CalibrationProbe, compress_decode: bool, steps: int, requantize=None):
    """Row 2 under ``probe``: a 30-token prompt (every third token a boundary, the rest free text), then
    ``steps`` decode steps; ``(pool, allocator, req_to_token, length)``."""

    def roles_of(row, positions):
        return torch.where(positions % 3 == 0, int(Role.BOUNDARY), int(Role.FREE_TEXT))

    pool, allocator, req_to_token = make_grouped(
        "full", roles_of=roles_of, compress_decode=compress_decode, probe_of=lambda row: probe
    )
    if requantize is not None:
        pool.views.requantize = requantize
    backend = backend_for(pool, req_to_token)
    generator = torch.Generator().manual_seed(5)
    ids = allocator.alloc(30)
    req_to_token[2, :30] = ids
    run_layers(backend, forward_batch([2], [30], [30], ids), 30, generator)
    return pool, allocator, req_to_token, decode_steps(backend, allocator, req_to_token, 2, 30, steps, generator)


@pytest.mark.parametrize("compress_decode", [True, False])
def test_a_drop_probe_drops_generated_tokens_only_where_decode_compresses(compress_decode):
    """A calibration probe drops its role as the server would: under --kv-decode keep, the prompt's only."""

    probe = CalibrationProbe(drop_group=ALL_GROUPS, drop_role=int(Role.BOUNDARY))
    pool, allocator, req_to_token, length = run_probe(probe, compress_decode, 9)
    prompt_kept = [p for p in range(30) if p % 3]
    generated = [p for p in range(30, length) if p % 3] if compress_decode else list(range(30, length))
    for g in range(2):
        held = pool.views.views[2].groups[g].positions(length, torch.device("cpu")).tolist()
        assert held == prompt_kept + generated
        assert allocator.group_used_slots(g) == len(held)
    allocator.free(req_to_token[2, :length].long())
    pool.views.release(2)
    assert allocator.available_size() == SLOTS and allocator.check_slots() == []


def test_a_lowbit_probe_of_every_role_requantizes_each_prompt_token_once_and_drops_none():
    """``drop_role: "all"`` with ``lowbit`` (the calibration's every-token probe): every private prompt
    token of every group goes through the low-bit round trip once; under keep no generated token does."""

    probe = CalibrationProbe(drop_group=ALL_GROUPS, drop_role=ALL_ROLES, lowbit="k4v2")
    stored: list[tuple[int, list[int], str]] = []

    def requantize(row, group, positions, fmt):
        stored.append((group, positions.tolist(), fmt))

    pool, allocator, req_to_token, length = run_probe(probe, False, 5, requantize)
    assert sorted(stored) == [(g, list(range(30)), "k4v2") for g in range(2)]
    for g in range(2):
        assert pool.views.views[2].groups[g].positions(length, torch.device("cpu")).tolist() == list(range(length))
    allocator.free(req_to_token[2, :length].long())
    pool.views.release(2)
    assert allocator.available_size() == SLOTS and allocator.check_slots() == []


@pytest.mark.parametrize("policy, score_window, expected", [("snapkv", 12, 12), ("snapkv", None, 4), ("h2o", 12, 32)])
def test_windowed_policies_score_with_the_observation_window(policy, score_window, expected):
    pool, allocator, req_to_token = make_grouped(policy, 0.5, window=4, score_window=score_window)
    scored = []
    add_scores = pool.views.add_scores

    def record(row, group, positions, scores, num_queries):
        scored.append(num_queries)
        add_scores(row, group, positions, scores, num_queries)

    pool.views.add_scores = record
    ids = allocator.alloc(32)
    req_to_token[3, :32] = ids
    run_layers(
        backend_for(pool, req_to_token), forward_batch([3], [32], [32], ids), 32, torch.Generator().manual_seed(3)
    )
    assert scored == [expected] * LAYERS
    allocator.free(ids.long())
    pool.views.release(3)


def test_admission_counts_what_evicting_the_cache_frees_per_group():
    """Cached tokens whose group-1 slots were dropped free slots in group 0 only: the allocatable
    count after eviction is taken per group (no deadlock when the fullest group is full of cache)."""
    pool, allocator, _ = make_grouped()
    cached = allocator.alloc(SLOTS - 6)
    allocator.drop(1, cached[: SLOTS // 2])
    assert allocator.available_size() == 6  # group 0 is the fullest
    free_ids = allocator.virtual_available_size()
    assert allocator.allocatable_after_eviction(cached) == (
        free_ids + cached.numel(),
        [6 + (SLOTS - 6), (SLOTS // 2 + 6) + (SLOTS - 6 - SLOTS // 2)],
    )
    # Only the unlocked ids count: 10 locked ones that group 1 dropped free nothing there.
    ids, groups = allocator.allocatable_after_eviction(cached[10:])
    assert (ids, groups) == (free_ids + cached.numel() - 10, [SLOTS - 10, SLOTS])


def test_pask_floors_protect_their_role_in_their_group_only():
    floors = [0.0] * len(Role)
    floors[Role.SCHEMA_PARAM_NAME] = 1.0
    table = PaskTable(
        floors=(tuple([0.0] * len(Role)), tuple(floors)),
        residual_shares=(0.5, 0.5),
        layers_per_group=(1, 1),
        role_frequencies=tuple([1 / len(Role)] * len(Role)),
    )

    def roles_of(row, positions):
        return torch.where(positions % 5 == 0, int(Role.SCHEMA_PARAM_NAME), int(Role.FREE_TEXT))

    pool, allocator, req_to_token = make_grouped("pask", 0.5, roles_of=roles_of, table=table)
    backend = backend_for(pool, req_to_token)
    ids = allocator.alloc(40)
    req_to_token[1, :40] = ids
    run_layers(backend, forward_batch([1], [40], [40], ids), 40, torch.Generator().manual_seed(9))
    protected = set(range(0, 40, 5))
    kept = [set(pool.views.views[1].groups[g].kept.tolist()) for g in range(2)]
    assert len(kept[0]) == len(kept[1]) == 20
    assert protected <= kept[1]
    assert not protected <= kept[0]  # group 0 has no floors (this seed's scores leave some out)


# Groups of different sizes: pyramid-like budgets on 2 one-layer groups. b_mean = 0.3, so with a
# fixed part of 96 slots group 0 gets floor(96 + 160 * 0.5 / 0.3) = 362 slots and group 1
# floor(96 + 160 * 0.1 / 0.3) = 149: 511 slots over the 2 layers, the bytes of SGLang's 2 x 256
# less one row of rounding.
UNEQUAL_BUDGETS = [0.5, 0.1]
UNEQUAL_SLOTS = group_slot_counts(SLOTS, UNEQUAL_BUDGETS, [1, 1], 96)


def test_group_slots_follow_the_budgets_for_the_same_slots_in_all():
    assert UNEQUAL_SLOTS == [362, 149]
    pyramid = [0.5753, 0.4118, 0.2482, 0.0847]  # pyramidkv at 0.33 over 4 groups of 6 layers
    slots = group_slot_counts(4096, pyramid, [6] * 4, 896)
    assert slots == sorted(slots, reverse=True) and min(slots) >= 896
    assert 24 * 4096 - 24 <= sum(6 * p for p in slots) <= 24 * 4096
    # Past the fixed part, slots are proportional to the budgets.
    assert [round((p - 896) / (slots[0] - 896), 3) for p in slots] == [round(b / pyramid[0], 3) for b in pyramid]
    # Uneven layer counts: the layer-weighted sum is what stays.
    slots = group_slot_counts(1000, [0.9, 0.2, 0.1], [2, 3, 7], 100)
    assert 12 * 1000 - 12 <= sum(n * p for n, p in zip([2, 3, 7], slots)) <= 12 * 1000
    # Equal budgets (uniform policies, full) or a fixed part of P: SGLang's P everywhere.
    assert group_slot_counts(4096, [0.33] * 4, [6] * 4, 896) == [4096] * 4
    assert group_slot_counts(4096, [1.0] * 4, [6] * 4, 0) == [4096] * 4
    assert group_slot_counts(4096, pyramid, [6] * 4, 4096) == [4096] * 4


def test_group_sizing_rejects_bad_input():
    with pytest.raises(ValueError, match="budgets for"):
        group_slot_counts(SLOTS, [0.5], [1, 1], 0)
    with pytest.raises(ValueError, match=r"in \(0, 1\]"):
        group_slot_counts(SLOTS, [0.5, 0.0], [1, 1], 0)
    with pytest.raises(ValueError, match="fixed part"):
        group_slot_counts(SLOTS, [0.5, 0.2], [1, 1], SLOTS + 1)
    with pytest.raises(ValueError, match="cannot address"):
        LayerGroupLayout((range(0, 1), range(1, 2)), SLOTS, (416, 96), 300)


def test_fixed_part_is_one_prefill_chunk_plus_every_requests_minimum():
    from sglang_pask.kvpool.sizing import FIXED_PART_REQUESTS, fixed_group_slots

    assert fixed_group_slots(4096, 512, 12) == 512 + FIXED_PART_REQUESTS * 12
    assert fixed_group_slots(4096, None, 12) == 4096  # chunked prefill off: one pass may fill the pool
    assert fixed_group_slots(600, 512, 12) == 600


def test_unequal_groups_have_buffers_of_their_size_and_the_bytes_of_the_stock_pool():
    pool = make_pool(layout=grouped_layout(UNEQUAL_BUDGETS, UNEQUAL_SLOTS))
    stock = make_pool(MHATokenToKVPool)
    assert [pool.get_key_buffer(i).shape[0] for i in range(LAYERS)] == [362 + 1, 149 + 1]
    assert [pool.get_value_buffer(i).shape[0] for i in range(LAYERS)] == [362 + 1, 149 + 1]
    grouped_bytes = sum(pool.group_buffer_bytes(g) for g in range(2))
    stock_bytes = sum(b.nbytes for b in (*stock.k_buffer, *stock.v_buffer))
    # (362 + 1) + (149 + 1) rows == 2 * (256 + 1) - 1: the stock bytes less one row of rounding.
    assert grouped_bytes == stock_bytes - pool.bytes_per_slot(0)
    assert pool.group_buffer_bytes(1) == (149 + 1) * pool.bytes_per_slot(1)
    # Equal groups keep SGLang's own buffers.
    equal = make_pool(layout=grouped_layout([0.3, 0.3]))
    assert [equal.get_key_buffer(i).shape for i in range(LAYERS)] == [
        stock.get_key_buffer(i).shape for i in range(LAYERS)
    ]


def test_writes_reach_each_groups_own_slots_past_the_stock_size():
    pool, allocator, _ = make_grouped(budgets=UNEQUAL_BUDGETS, group_slots=UNEQUAL_SLOTS)
    chunks = []
    while allocator.group_used_slots(0) < 362:  # group 0 past the stock pool's 256 slots, to its last
        chunks.append(allocator.alloc(min(362 - allocator.group_used_slots(0), 149)))
        assert chunks[-1] is not None
        allocator.drop(1, chunks[-1])
    assert allocator.alloc(1) is None
    more = torch.cat(chunks)
    assert int(pool.physical(0, more).max()) == 362
    generator = torch.Generator().manual_seed(11)
    for layer_id in range(LAYERS):
        k = torch.randn(more.numel(), KV_HEADS, HEAD_DIM, generator=generator)
        v = torch.randn(more.numel(), KV_HEADS, HEAD_DIM, generator=generator)
        pool.set_kv_buffer(layer(layer_id), more, k, v)
        physical = pool.physical(pool.layer_group[layer_id], more)
        if layer_id == 1:  # group 1 dropped them all: its writes go to the padding slot 0
            assert int(physical.count_nonzero()) == 0
            continue
        assert torch.equal(pool.get_key_buffer(layer_id)[physical], k)
        assert torch.equal(pool.get_value_buffer(layer_id)[physical], v)
    assert allocator.check_slots() == []


def test_unequal_groups_conserve_slots_and_allocate_all_or_nothing():
    pool, allocator, _ = make_grouped(budgets=UNEQUAL_BUDGETS, group_slots=UNEQUAL_SLOTS)
    first = allocator.alloc(140)
    assert [allocator.group_used_slots(g) for g in range(2)] == [140, 140]
    # Group 1 (149 slots) is the fullest: it bounds what can be allocated now.
    assert allocator.available_size() == 9 and allocator.alloc(10) is None
    assert [allocator.group_used_slots(g) for g in range(2)] == [140, 140]
    assert allocator.virtual_available_size() == pool.layout.virtual_slots - 140
    assert allocator.drop(1, first[:120]) == 120
    second = allocator.alloc(120)
    assert second is not None and [allocator.group_used_slots(g) for g in range(2)] == [260, 140]
    assert allocator.available_size() == 149 - 140  # group 1 is still the fullest
    assert allocator.check_slots() == []
    allocator.free(torch.cat((first, second)))
    assert [allocator.group_used_slots(g) for g in range(2)] == [0, 0]
    assert allocator.virtual_available_size() == pool.layout.virtual_slots
    assert allocator.check_slots() == [] and int(pool.group_loc.count_nonzero()) == 0
    # A slot mapped twice is caught.
    ids = allocator.alloc(2)
    pool.group_loc[0, ids[1]] = pool.group_loc[0, ids[0]]
    assert any("group 0" in problem for problem in allocator.check_slots())


def run_requests(
    allocator, budgets, window: int, slack: int, prompt_len: int, new_tokens: int, admit_one
) -> tuple[int, list[int]]:
    """Admit identical requests one scheduling round at a time, as SGLang does with a running batch:
    each round asks ``admit_one(running)`` whether one more fits; an admitted prompt is written to
    every group and compressed to the group's capacity (as the views do after prefill). Then every
    request decodes ``new_tokens`` tokens, each group compressing past capacity + slack. Returns how
    many ran at once and the most slots each group held; every allocation must succeed."""
    running = []
    while admit_one(len(running)):
        ids = allocator.alloc(prompt_len)
        assert ids is not None, "an admitted prompt could not be written"
        held = []
        for g, b in enumerate(budgets):
            cap = capacity(b, prompt_len, window)
            allocator.drop(g, ids[: prompt_len - cap])
            held.append(ids[prompt_len - cap :])
        running.append((ids, held))
    peak = [allocator.group_used_slots(g) for g in range(len(budgets))]
    for step in range(1, new_tokens + 1):
        for index, (ids, held) in enumerate(running):
            token = allocator.alloc(1)
            assert token is not None, "an admitted request could not decode"
            for g, b in enumerate(budgets):
                held[g] = torch.cat((held[g], token))
                cap = capacity(b, prompt_len + step, window)
                if held[g].numel() > cap + slack:
                    allocator.drop(g, held[g][:-cap])
                    held[g] = held[g][-cap:]
            running[index] = (torch.cat((ids, token)), held)
        peak = [max(p, allocator.group_used_slots(g)) for g, p in enumerate(peak)]
    for ids, _ in running:
        allocator.free(ids)
    return len(running), peak


def sglang_admits(allocator, prompt_len: int, new_tokens: int):
    """One round of SGLang's admission through the layer-group prefill budget: the running requests'
    decode headroom, then the new request (prompt + page, ``new_tokens``)."""

    def admit_one(running: int) -> bool:
        budget = LayerGroupPrefillBudget(allocator, None)
        for _ in range(running):
            budget.reserve_running(new_tokens)
        fits, _ = budget.check_prefill(
            extend_input_len=prompt_len,
            total_tokens=prompt_len + 1 + new_tokens,
            max_new_tokens=new_tokens,
            input_tokens=prompt_len,
            swa_host_hit_length=0,
            chunk_limit=None,
        )
        if fits:
            budget.reserve(prompt_len, new_tokens)
            assert budget.remaining_total >= 0
        return fits

    return admit_one


@pytest.mark.parametrize("group_slots", [UNEQUAL_SLOTS, None], ids=["sized", "equal"])
def test_admission_counts_every_group_and_what_it_admits_runs(group_slots):
    window, slack, prompt_len, new_tokens = 4, 2, 60, 4
    pool, allocator, _ = make_grouped(budgets=UNEQUAL_BUDGETS, group_slots=group_slots)
    allocator.growth_overhead = window + slack
    served, peak = run_requests(
        allocator,
        UNEQUAL_BUDGETS,
        window,
        slack,
        prompt_len,
        new_tokens,
        sglang_admits(allocator, prompt_len, new_tokens),
    )
    assert all(p <= s for p, s in zip(peak, pool.layout.group_slots))
    assert allocator.check_slots() == [] and allocator.virtual_available_size() == pool.layout.virtual_slots
    # Each request holds 30 + 4 slots in group 0 and 6 + 4 in group 1, and a new one needs 61 + 4 in
    # each: sized groups (362, 149) serve 9 at once, equal groups (256, 256) 6.
    assert served == (9 if group_slots else 6)


def test_a_prompt_longer_than_a_chunk_is_charged_its_peak_in_each_group_and_its_passes_fit():
    window, slack, chunk, prompt_len, new_tokens = 4, 2, 32, 120, 4
    pool, allocator, _ = make_grouped(budgets=UNEQUAL_BUDGETS, group_slots=UNEQUAL_SLOTS)
    allocator.growth_overhead, allocator.prefill_chunk = window + slack, chunk
    # One pass or less: the whole prompt; longer: b_g of it + (ceil(n / c) + 1) overheads + one chunk.
    assert allocator.prompt_peak(1, chunk) == chunk
    assert allocator.prompt_peak(0, prompt_len) == prompt_len  # 60 + 5 * 6 + 32 > 120
    assert allocator.prompt_peak(1, prompt_len) == pytest.approx(12 + 5 * 6 + 32)
    # Other requests hold 49 slots of the least-kept group: 100 are free there, fewer than the
    # prompt but more than its peak.
    others = allocator.alloc(49)
    allocator.drop(0, others)
    budget = LayerGroupPrefillBudget(allocator, None)
    fits, limit = budget.check_prefill(
        extend_input_len=prompt_len,
        total_tokens=prompt_len + 1 + new_tokens,
        max_new_tokens=new_tokens,
        input_tokens=prompt_len,
        swa_host_hit_length=0,
        chunk_limit=chunk,
    )
    assert fits and limit == chunk
    budget.reserve(chunk, 0)  # SGLang reserves a chunked request's first pass, without decode
    # Its peak (the prompt with SGLang's page token) and decode, not just the pass.
    assert budget.group_offsets[1] == pytest.approx(allocator.prompt_peak(1, prompt_len + 1) + new_tokens)
    # Prefill it as the views do: each pass written to every group, then compressed to capacity.
    peak_used, written = 0, 0
    while written < prompt_len:
        size = min(chunk, prompt_len - written)
        ids = allocator.alloc(size)
        assert ids is not None, "an admitted prompt's pass could not be written"
        peak_used = max(peak_used, allocator.group_used_slots(1) - 49)
        for group, group_budget in enumerate(UNEQUAL_BUDGETS):
            allocator.drop(group, ids[: size - capacity(group_budget, size, window)])
        written += size
    assert peak_used <= allocator.prompt_peak(1, prompt_len)


def test_decode_growth_follows_each_groups_budget():
    _, allocator, _ = make_grouped(budgets=UNEQUAL_BUDGETS, group_slots=UNEQUAL_SLOTS)
    allocator.growth_overhead = 6
    assert allocator.decode_growth(0, 100) == pytest.approx(56) and allocator.decode_growth(1, 100) == pytest.approx(16)
    assert allocator.decode_growth(1, 3) == 3  # never more than the tokens themselves
    budget = LayerGroupPrefillBudget(allocator, None)
    budget.reserve_running(100)
    assert budget.group_offsets == [pytest.approx(56), pytest.approx(16)] and budget.id_offset == 100
    assert budget.remaining_total == pytest.approx(min(362 - 56, 149 - 16))
