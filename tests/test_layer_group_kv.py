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
from sglang_pask.policy import PaskTable, available_policies, capacity, get_policy  # noqa: E402
from sglang_pask.structure.roles import Role  # noqa: E402
from sglang_pask.srt.kv_views import KVViewTable  # noqa: E402
from sglang_pask.srt.layer_group_attention import LayerGroupTorchNativeAttnBackend  # noqa: E402
from sglang_pask.srt.group_sizing import group_slot_counts, virtual_slot_count  # noqa: E402
from sglang_pask.srt.layer_group_pool import (  # noqa: E402
    LayerGroupAllocator,
    LayerGroupLayout,
    LayerGroupMHAKVPool,
    LayerGroupPrefillBudget,
)

Q_HEADS, KV_HEADS, HEAD_DIM, LAYERS = 4, 2, 8, 2
SLOTS, ROWS, CONTEXT = 256, 8, 128


def make_pool(pool_class=LayerGroupMHAKVPool, dtype=torch.float32, layers=LAYERS, **layout):
    return pool_class(SLOTS, page_size=1, dtype=dtype, head_num=KV_HEADS, head_dim=HEAD_DIM, layer_num=layers,
                      device="cpu", enable_memory_saver=False, **layout)


def grouped_layout(budgets, group_slots=None, layers=LAYERS):
    """One layer per group unless ``layers`` says otherwise; ``group_slots`` defaults to ``P`` each."""
    per_group = layers // len(budgets)
    ranges = tuple(range(g * per_group, (g + 1) * per_group) for g in range(len(budgets)))
    slots = tuple(group_slots or [SLOTS] * len(budgets))
    return LayerGroupLayout(ranges, SLOTS, slots, virtual_slot_count(slots, budgets))


def make_grouped(policy: str = "snapkv", budget: float = 0.33, window: int = 4, roles_of=None, budgets=None,
                 group_slots=None, **options):
    """A layer-group pool (one layer per group), its allocator and view table, and req_to_token."""
    if budgets is None:
        budgets = [1.0, 1.0] if policy == "full" else [budget, budget]
    pool = make_pool(layout=grouped_layout(budgets, group_slots))
    allocator = LayerGroupAllocator(pool, torch.float32, "cpu", need_sort=False, budgets=budgets)
    req_to_token = torch.zeros((ROWS, CONTEXT), dtype=torch.int32)

    def drop(row, group, positions):
        allocator.drop(group, req_to_token[row, positions])

    pool.views = KVViewTable(get_policy(policy, **options), budgets, window, drop, slack=2, roles_of=roles_of)
    return pool, allocator, req_to_token


def layer(layer_id: int) -> SimpleNamespace:
    return SimpleNamespace(layer_id=layer_id, tp_q_head_num=Q_HEADS, tp_k_head_num=KV_HEADS, qk_head_dim=HEAD_DIM,
                           v_head_dim=HEAD_DIM, scaling=HEAD_DIM ** -0.5, is_cross_attention=False,
                           sliding_window_size=-1, attn_type=None)


def backend_for(pool, req_to_token, backend_class=LayerGroupTorchNativeAttnBackend):
    runner = SimpleNamespace(device="cpu", req_to_token_pool=SimpleNamespace(req_to_token=req_to_token),
                             token_to_kv_pool=pool)
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
    kv_before = [(pool.get_key_buffer(i)[physical_before[i]].clone(), pool.get_value_buffer(i)[physical_before[i]].clone())
                 for i in range(LAYERS)]
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
        # Each request keeps floor(0.33 * 30) = 9 of its 30 private tokens; the rest went back.
        assert kept.numel() == 20 + 9
        assert allocator.group_used_slots(g) == used_before[g] - 2 * (30 - 9)
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
        logits = torch.einsum("hd,lhd->hl", queries, expanded_k) * HEAD_DIM ** -0.5
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
    length = 32
    for _ in range(12):
        step = allocator.alloc(1)
        req_to_token[3, length] = step
        length += 1
        run_layers(backend, forward_batch([3], [length], [1], step, decode=True), 1, generator, decode=True)
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


def test_admission_counts_what_evicting_the_cache_frees_per_group():
    """Cached tokens whose group-1 slots were dropped free slots in group 0 only: the allocatable
    count after eviction is taken per group (no deadlock when the fullest group is full of cache)."""
    pool, allocator, _ = make_grouped()
    cached = allocator.alloc(SLOTS - 6)
    allocator.drop(1, cached[: SLOTS // 2])
    assert allocator.available_size() == 6  # group 0 is the fullest
    free_ids = allocator.virtual_available_size()
    assert allocator.allocatable_after_eviction(cached, cached.numel(), 0) == min(
        free_ids + cached.numel(), 6 + (SLOTS - 6), (SLOTS // 2 + 6) + (SLOTS - 6 - SLOTS // 2))
    assert allocator.allocatable_after_eviction(cached, cached.numel() - 10, 10) == SLOTS - 10
def test_pask_floors_protect_their_role_in_their_group_only():
    floors = [0.0] * len(Role)
    floors[Role.SCHEMA_PARAM_NAME] = 1.0
    table = PaskTable(floors=(tuple([0.0] * len(Role)), tuple(floors)), residual_shares=(0.5, 0.5),
                      layers_per_group=(1, 1), role_frequencies=tuple([1 / len(Role)] * len(Role)))

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
