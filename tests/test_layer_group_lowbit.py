"""``--kv-dropped 2bit|k4v2`` in process: the layer-group pool keeps dropped tokens as low-bit blocks
(and values at 4 bits, which the store supports though no mode asks for it).

Real SGLang classes (its MHA pool, token allocator and torch_native backend) with sglang-pask's
layer-group subclasses and the low-bit store; the model runner and forward batch are minimal stand-ins
carrying only the fields the backend reads.
"""

from __future__ import annotations

import os

os.environ.setdefault("SGLANG_USE_CPU_ENGINE", "1")

from types import SimpleNamespace  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402

from sglang_pask.kernels.kv_lowbit import (  # noqa: E402
    BLOCK_TOKENS,
    dequantize_key_blocks,
    dequantize_value_blocks,
    pad_block,
    quantize_key_blocks,
    quantize_value_blocks,
)
from sglang_pask.kvpool.compression import KVViewTable  # noqa: E402
from sglang_pask.kvpool.lowbit import BlockFormat, LowBitStore  # noqa: E402
from sglang_pask.kvpool.sizing import LayerGroupLayout, virtual_slot_count  # noqa: E402
from sglang_pask.policy import capacity, get_policy  # noqa: E402
from sglang_pask.srt.attention.torch_native import LayerGroupTorchNativeAttnBackend  # noqa: E402
from sglang_pask.srt.pool import LayerGroupAllocator, LayerGroupMHAKVPool  # noqa: E402

Q_HEADS, KV_HEADS, HEAD_DIM, LAYERS = 4, 2, 32, 2
ROWS, CONTEXT, WINDOW, BUDGET = 4, 160, 4, 0.25
TWO_BIT = BlockFormat(2, 2)
FORMATS = [TWO_BIT, BlockFormat(2, 4), BlockFormat(4, 2)]


def make_store(
    slots: int = 512,
    dtype: torch.dtype = torch.float32,
    block_format: BlockFormat = TWO_BIT,
    whole_blocks: bool = False,
    lowbit_decode: bool = False,
):
    """A two-group pool (one layer each) with its allocator, low-bit store and views (SnapKV, decode keeps,
    or with ``lowbit_decode`` stores generated tokens in blocks); ``whole_blocks`` tells the views the
    block size, as the server does."""
    budgets = [BUDGET, BUDGET]
    layout = LayerGroupLayout(
        (range(0, 1), range(1, 2)), slots, (slots, slots), virtual_slot_count([slots] * 2, budgets)
    )
    pool = LayerGroupMHAKVPool(
        slots,
        page_size=1,
        dtype=dtype,
        head_num=KV_HEADS,
        head_dim=HEAD_DIM,
        layer_num=LAYERS,
        device="cpu",
        enable_memory_saver=False,
        layout=layout,
    )
    allocator = LayerGroupAllocator(pool, dtype, "cpu", need_sort=False, budgets=budgets, compress_decode=False)
    store = allocator.lowbit = pool.lowbit = LowBitStore(block_format, pool, allocator)
    req_to_token = torch.zeros((ROWS, CONTEXT), dtype=torch.int32)

    def drop(row, group, positions):
        store.drop(group, req_to_token[row, positions])

    dropped_block = (BLOCK_TOKENS, store.rows_per_block) if whole_blocks else None
    pool.views = KVViewTable(
        get_policy("snapkv"),
        budgets,
        WINDOW,
        drop,
        slack=2,
        compress_decode=False,
        dropped_block=dropped_block,
        decode_block=BLOCK_TOKENS if lowbit_decode else None,
    )
    runner = SimpleNamespace(
        device="cpu", req_to_token_pool=SimpleNamespace(req_to_token=req_to_token), token_to_kv_pool=pool
    )
    return pool, allocator, store, req_to_token, LayerGroupTorchNativeAttnBackend(runner)


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


def forward_batch(rows, seq_lens, extend_lens, out_cache_loc, decode=False):
    return SimpleNamespace(
        forward_mode=SimpleNamespace(is_decode=lambda: decode),
        req_pool_indices=torch.tensor(rows),
        seq_lens=torch.tensor(seq_lens),
        seq_lens_cpu=torch.tensor(seq_lens),
        extend_seq_lens_cpu=list(extend_lens),
        encoder_lens=None,
        out_cache_loc=out_cache_loc,
    )


def run_layers(backend, batch, tokens: int, generator, decode=False):
    """Every layer once with random q/k/v; returns ((q, k, v, output), ...) by layer."""
    backend.init_forward_metadata(batch)
    results = []
    for layer_id in range(LAYERS):
        q = torch.randn(tokens, Q_HEADS * HEAD_DIM, generator=generator)
        k = torch.randn(tokens, KV_HEADS, HEAD_DIM, generator=generator) * 2
        v = torch.randn(tokens, KV_HEADS, HEAD_DIM, generator=generator)
        run = backend.forward_decode if decode else backend.forward_extend
        results.append((q, k, v, run(q, k, v, layer(layer_id), batch)))
    return results


def quantized(tokens: torch.Tensor, keys: bool, block_format: BlockFormat = TWO_BIT) -> torch.Tensor:
    """``(n, heads, head_dim)`` through low-bit blocks of 32 consecutive tokens and back."""
    bits = block_format.key_bits if keys else block_format.value_bits
    out = []
    for chunk in tokens.split(BLOCK_TOKENS):
        packed = (quantize_key_blocks if keys else quantize_value_blocks)(pad_block(chunk)[None], bits)
        out.append(
            (dequantize_key_blocks if keys else dequantize_value_blocks)(packed, KV_HEADS, HEAD_DIM, bits)[
                0, : chunk.shape[0]
            ]
        )
    return torch.cat(out)


def prefill(allocator, req_to_token, backend, row: int, length: int, generator):
    ids = allocator.alloc(length)
    req_to_token[row, :length] = ids
    return run_layers(backend, forward_batch([row], [length], [length], ids), length, generator)


@pytest.mark.parametrize("block_format", FORMATS)
def test_decode_reads_kept_tokens_in_full_and_dropped_ones_at_low_precision(block_format):
    # Three requests decode in one batch; one has no low-bit token.
    pool, allocator, store, req_to_token, backend = make_store(block_format=block_format)
    generator = torch.Generator().manual_seed(11)
    lengths = {1: 100, 2: 3, 3: 70}
    extends = {
        row: prefill(allocator, req_to_token, backend, row, length, generator) for row, length in lengths.items()
    }
    steps = allocator.alloc(len(lengths))
    for row, step in zip(lengths, steps):
        req_to_token[row, lengths[row]] = step
    batch = forward_batch(list(lengths), [n + 1 for n in lengths.values()], [1] * len(lengths), steps, decode=True)
    decode = run_layers(backend, batch, len(lengths), generator, decode=True)
    for index, (row, length) in enumerate(lengths.items()):
        for group, ((_, k, v, _), (q, k_new, v_new, output)) in enumerate(zip(extends[row], decode)):
            kept = pool.views.views[row].groups[group].kept  # None: nothing was compressed
            kept = list(range(length)) if kept is None else kept.tolist()
            assert len(kept) == capacity(BUDGET, length, WINDOW)
            dropped = torch.tensor(sorted(set(range(length)) - set(kept)), dtype=torch.int64)
            located = store.locate(group, req_to_token[row, :length])
            assert (located is None) == (row == 2) and (located is None or torch.equal(located.positions, dropped))
            keys, values = k.clone(), v.clone()
            if dropped.numel():
                keys[dropped] = quantized(k[dropped], True, block_format)
                values[dropped] = quantized(v[dropped], False, block_format)
            keys = torch.cat((keys, k_new[index : index + 1]))
            values = torch.cat((values, v_new[index : index + 1]))
            query = q[index].view(Q_HEADS, HEAD_DIM)
            logits = torch.einsum("hd,lhd->hl", query, keys.repeat_interleave(2, dim=1)) * HEAD_DIM**-0.5
            reference = torch.einsum("hl,lhd->hd", torch.softmax(logits, dim=-1), values.repeat_interleave(2, dim=1))
            torch.testing.assert_close(output[index], reference.reshape(-1), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("block_format", FORMATS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_blocks_take_slots_of_the_group_and_all_come_back(dtype, block_format):
    pool, allocator, store, req_to_token, backend = make_store(dtype=dtype, block_format=block_format)
    generator = torch.Generator().manual_seed(12)
    rows = block_format.rows_per_block(dtype.itemsize)
    lengths = {1: 100, 2: 37}
    for row, length in lengths.items():
        prefill(allocator, req_to_token, backend, row, length, generator)
    for group in range(2):
        expected = 0
        for length in lengths.values():
            kept = capacity(BUDGET, length, WINDOW)
            expected += kept + -(-(length - kept) // BLOCK_TOKENS) * rows
        assert allocator.group_used_slots(group) == expected
        assert [store.row_summary(req_to_token[row, :length])[0][group].numel() for row, length in lengths.items()] == [
            length - capacity(BUDGET, length, WINDOW) for length in lengths.values()
        ]
    assert allocator.check_slots() == []
    for row, length in lengths.items():
        allocator.free(req_to_token[row, :length])
    assert [allocator.group_used_slots(g) for g in range(2)] == [0, 0]
    assert allocator.check_slots() == []


def test_a_group_without_free_slots_drops_outright_and_leaks_nothing():
    # A 6-slot pool that one 6-token prompt fills: it keeps 4 and drops 2, which free 2 slots, fewer
    # than the 3 a float32 block takes.
    pool, allocator, store, req_to_token, backend = make_store(slots=6)
    generator = torch.Generator().manual_seed(13)
    prefill(allocator, req_to_token, backend, 1, 6, generator)
    assert capacity(BUDGET, 6, WINDOW) == 4
    assert store.unstored_tokens == 2 * 2  # 2 tokens in each group
    assert all(p.numel() == 0 for p in store.row_summary(req_to_token[1, :6])[0])
    assert [allocator.group_used_slots(g) for g in range(2)] == [4, 4]
    assert allocator.check_slots() == []
    allocator.free(req_to_token[1, :6])
    assert [allocator.group_used_slots(g) for g in range(2)] == [0, 0]


@pytest.mark.parametrize("block_format", [TWO_BIT, BlockFormat(4, 2)])
def test_a_later_request_reads_a_cached_prefix_at_low_precision(block_format):
    # Row 2 starts with row 1's first 64 token ids, as a radix-cache match gives it, after row 1
    # left; its decode step reads that prefix: row 1's kept tokens in full, its dropped ones at low precision.
    pool, allocator, store, req_to_token, backend = make_store(block_format=block_format)
    generator = torch.Generator().manual_seed(14)
    length, shared = 100, 64
    extend = prefill(allocator, req_to_token, backend, 1, length, generator)
    dropped = [store.locate(group, req_to_token[1, :length]).positions for group in range(2)]
    pool.views.release(1)
    allocator.free(req_to_token[1, shared:length])  # the uncached tail goes; the prefix stays cached
    req_to_token[2, :shared] = req_to_token[1, :shared]
    step = allocator.alloc(1)
    req_to_token[2, shared] = step
    decode = run_layers(backend, forward_batch([2], [shared + 1], [1], step, decode=True), 1, generator, decode=True)
    for group, ((_, k, v, _), (q, k_new, v_new, output)) in enumerate(zip(extend, decode)):
        lowbit = store.locate(group, req_to_token[2, : shared + 1])
        in_prefix = dropped[group][dropped[group] < shared]
        assert lowbit is not None and 0 < lowbit.positions.numel() < shared
        assert torch.equal(lowbit.positions, in_prefix)
        full = pool.physical(group, req_to_token[2, :shared]) > 0
        assert torch.equal(torch.nonzero(~full).flatten(), in_prefix)  # every prefix token is read
        # Row 1 packed its dropped tokens in blocks of 32 of its dropped positions, in order.
        keys, values = k.clone(), v.clone()
        keys[dropped[group]] = quantized(k[dropped[group]], True, block_format)
        values[dropped[group]] = quantized(v[dropped[group]], False, block_format)
        keys, values = torch.cat((keys[:shared], k_new)), torch.cat((values[:shared], v_new))
        logits = (
            torch.einsum("hd,lhd->hl", q.view(Q_HEADS, HEAD_DIM), keys.repeat_interleave(2, dim=1)) * HEAD_DIM**-0.5
        )
        reference = torch.einsum("hl,lhd->hd", torch.softmax(logits, dim=-1), values.repeat_interleave(2, dim=1))
        torch.testing.assert_close(output, reference.reshape(1, -1), rtol=1e-5, atol=1e-5)


def test_a_block_lives_while_any_of_its_token_ids_is_allocated():
    pool, allocator, store, req_to_token, backend = make_store()
    generator = torch.Generator().manual_seed(15)
    length = 100
    prefill(allocator, req_to_token, backend, 1, length, generator)
    ids = req_to_token[1, :length]
    before = [allocator.group_used_slots(g) for g in range(2)]
    # Free the tail (a cache evicting a leaf): blocks wholly inside it go, a block reaching into the
    # rest stays; freed_by foresees exactly the block slots that come back.
    tail = ids[70:]
    foreseen = [store.freed_by(g, tail) for g in range(2)]
    kept_in_tail = [int((pool.physical(g, tail) > 0).sum()) for g in range(2)]
    allocator.free(tail)
    after = [allocator.group_used_slots(g) for g in range(2)]
    assert [b - a for b, a in zip(before, after)] == [f + k for f, k in zip(foreseen, kept_in_tail)]
    for group in range(2):
        located = store.locate(group, ids[:70])
        assert located is not None and bool((located.positions < 70).all())
        assert store.held_slots(group).numel() == located.slots.numel()  # only blocks with a live token
    assert allocator.check_slots() == []
    allocator.free(ids[:70])
    assert [allocator.group_used_slots(g) for g in range(2)] == [0, 0]
    assert [store.held_slots(g).numel() for g in range(2)] == [0, 0]
    assert int(store.token_block.count_nonzero()) == 0 and allocator.check_slots() == []


def test_storage_budget_counts_the_blocks():
    assert TWO_BIT.rows_per_block(2) == 6 and TWO_BIT.rows_per_block(4) == 3 and TWO_BIT.rows_per_block(1) == 12
    assert BlockFormat(2, 4).rows_per_block(2) == 8 and BlockFormat(4, 2).rows_per_block(4) == 4
    assert TWO_BIT.storage_budget(0.175, 2) == pytest.approx(0.175 + 0.825 * 6 / 32)
    assert BlockFormat(2, 4).storage_budget(0.047, 2) == pytest.approx(0.047 + 0.953 / 4)
    assert TWO_BIT.storage_budget(1.0, 4) == 1.0
    # A tiered policy stores only its expected low-bit share in blocks; the rest is evicted.
    assert BlockFormat(4, 2).storage_budget(0.02, 2, lowbit_share=0.5) == pytest.approx(0.02 + 0.5 * 8 / 32)
    with pytest.raises(ValueError, match="1, 2 or 4 bytes"):
        TWO_BIT.rows_per_block(3)
    with pytest.raises(ValueError, match="2 or 4 bits"):
        BlockFormat(2, 3)


def test_a_head_dim_that_is_not_a_multiple_of_32_is_refused():
    layout = LayerGroupLayout((range(0, 1), range(1, 2)), 64, (64, 64), 64)
    pool = LayerGroupMHAKVPool(
        64,
        page_size=1,
        dtype=torch.float32,
        head_num=KV_HEADS,
        head_dim=48,
        layer_num=LAYERS,
        device="cpu",
        enable_memory_saver=False,
        layout=layout,
    )
    allocator = LayerGroupAllocator(pool, torch.float32, "cpu", need_sort=False)
    with pytest.raises(RuntimeError, match="low-bit blocks: .*multiple of 32"):
        LowBitStore(TWO_BIT, pool, allocator)


@pytest.mark.parametrize(
    "length, kept, lowbit_slots",
    [
        # floor(0.25 * 45) = 11 kept would leave 34 dropped: one block and 2 tokens; the 2 cost fewer slots
        # in full than a second block (3 slots of fp32 at 2 bits), so 13 are kept and 32 fill one block.
        (45, 13, 3),
        # floor(0.25 * 100) = 25 leaves 75 dropped: two blocks and 11 tokens, which cost more in full than
        # a third, partial block.
        (100, 25, 9),
    ],
)
def test_the_dropped_tokens_of_a_pass_fill_whole_blocks_unless_the_rest_costs_more_in_full(length, kept, lowbit_slots):
    pool, allocator, store, req_to_token, backend = make_store(whole_blocks=True)
    assert store.rows_per_block == 3
    prefill(allocator, req_to_token, backend, 1, length, torch.Generator().manual_seed(2))
    positions, slots = store.row_summary(req_to_token[1, :length])
    for group in range(2):
        assert pool.views.views[1].groups[group].kept.numel() == kept
        assert positions[group].numel() == length - kept
        assert slots[group] == lowbit_slots
    assert allocator.check_slots() == []


def test_block_places_say_whose_tokens_fill_the_blocks_a_row_reads():
    # Row 1 drops 75 of 100 tokens per group: 3 blocks of one pass, 21 places never filled. Row 2 then
    # reads row 1's first 64 ids (a matched prefix): the block straddling position 64 also holds row 1's
    # later tokens (other rows), and once row 1's tail is freed, those places count as freed.
    pool, allocator, store, req_to_token, backend = make_store()
    length, shared = 100, 64
    prefill(allocator, req_to_token, backend, 1, length, torch.Generator().manual_seed(3))
    dropped = [store.locate(group, req_to_token[1, :length]).positions for group in range(2)]
    assert [p.as_dict() for p in store.row_block_places(req_to_token[1, :length])] == [
        dict(blocks=3, passes=1, row_tokens=75, other_rows=0, freed=0, never_filled=21)
    ] * 2
    req_to_token[2, :shared] = req_to_token[1, :shared]
    before = store.row_block_places(req_to_token[2, :shared])
    allocator.free(req_to_token[1, shared:length])
    after = store.row_block_places(req_to_token[2, :shared])
    assert store.placed_passes == 2  # one drop call per group
    for group in range(2):
        in_prefix = int((dropped[group] < shared).sum())
        blocks = -(-in_prefix // BLOCK_TOKENS)
        beyond = min(blocks * BLOCK_TOKENS, 75) - in_prefix  # row 1's later tokens in the straddling block
        never = blocks * BLOCK_TOKENS - min(blocks * BLOCK_TOKENS, 75)
        assert before[group].as_dict() == dict(
            blocks=blocks, passes=1, row_tokens=in_prefix, other_rows=beyond, freed=0, never_filled=never
        )
        assert after[group].as_dict() == dict(
            blocks=blocks, passes=1, row_tokens=in_prefix, other_rows=0, freed=beyond, never_filled=never
        )
    allocator.free(req_to_token[1, :shared])
    assert [allocator.group_used_slots(g) for g in range(2)] == [0, 0]


def test_lowbit_decode_stores_the_oldest_generated_tokens_as_one_whole_block_and_reads_them_back():
    # A 40-token prompt, then decode: once 32 generated tokens lie outside the window, each group drops
    # exactly those 32 into one block (no place left unfilled); the step after reads them at low precision.
    pool, allocator, store, req_to_token, backend = make_store(lowbit_decode=True)
    generator = torch.Generator().manual_seed(5)
    length = 40
    extend = prefill(allocator, req_to_token, backend, 1, length, generator)
    prompt_dropped = [store.locate(group, req_to_token[1, :length]).positions for group in range(2)]
    keys = [k.clone() for _, k, _, _ in extend]
    values = [v.clone() for _, _, v, _ in extend]
    seq = length
    for _ in range(WINDOW + BLOCK_TOKENS + 3):
        step = allocator.alloc(1)
        req_to_token[1, seq] = step
        decode = run_layers(backend, forward_batch([1], [seq + 1], [1], step, decode=True), 1, generator, decode=True)
        seq += 1
        stored = (
            torch.arange(length, length + BLOCK_TOKENS)
            if seq - length >= WINDOW + BLOCK_TOKENS
            else torch.zeros(0, dtype=torch.int64)
        )
        for group, (_, k_new, v_new, output) in enumerate(decode):
            located = store.locate(group, req_to_token[1, :seq]).positions
            assert torch.equal(located, torch.cat((prompt_dropped[group], stored)))
            query = decode[group][0].view(Q_HEADS, HEAD_DIM)
            # This step read the generated tokens stored after the previous step at low precision.
            read_stored = stored if seq - 1 - length >= WINDOW + BLOCK_TOKENS else torch.zeros(0, dtype=torch.int64)
            k_ref = torch.cat((keys[group], k_new))
            v_ref = torch.cat((values[group], v_new))
            for positions in (prompt_dropped[group], read_stored):
                if positions.numel():
                    k_ref[positions] = quantized(k_ref[positions], True)
                    v_ref[positions] = quantized(v_ref[positions], False)
            logits = torch.einsum("hd,lhd->hl", query, k_ref.repeat_interleave(2, dim=1)) * HEAD_DIM**-0.5
            reference = torch.einsum("hl,lhd->hd", torch.softmax(logits, dim=-1), v_ref.repeat_interleave(2, dim=1))
            torch.testing.assert_close(output[0], reference.reshape(-1), rtol=1e-5, atol=1e-5)
            keys[group], values[group] = torch.cat((keys[group], k_new)), torch.cat((values[group], v_new))
    for group, places in enumerate(store.row_block_places(req_to_token[1, :seq])):
        prompt_blocks = -(-prompt_dropped[group].numel() // BLOCK_TOKENS)
        assert places.blocks == prompt_blocks + 1 and places.passes == 2
        assert places.never_filled == prompt_blocks * BLOCK_TOKENS - prompt_dropped[group].numel()
    assert allocator.check_slots() == []
    allocator.free(req_to_token[1, :seq])
    assert [allocator.group_used_slots(g) for g in range(2)] == [0, 0]


def test_a_tiered_policy_sizes_each_group_for_its_expected_low_bit_share():
    from sglang_pask.config import PaskConfig
    from sglang_pask.policy.pask import NUM_ROLES, PaskPolicy, PaskTable
    from sglang_pask.srt.active_pool import storage_budgets

    evicted, stored = [0.0] * NUM_ROLES, [1.0] * NUM_ROLES
    evicted[0] = 1.0  # group 0 keeps role 0 (a quarter of the tokens) at low bits, evicts the rest
    table = PaskTable(
        floors=(tuple([0.0] * NUM_ROLES),) * 2,
        residual_shares=(0.5, 0.5),
        layers_per_group=(1, 1),
        role_frequencies=tuple([0.25] * 4 + [0.0] * (NUM_ROLES - 4)),
        lowbit=(tuple(evicted), tuple(stored)),
    )
    config = PaskConfig(kv_policy="pask", kv_budget=0.1, kv_dropped="k4v2", kv_decode="lowbit")
    cost = BlockFormat(4, 2).rows_per_block(2) / 32
    assert PaskPolicy(table=table).lowbit_shares(2) == [0.25, 1.0]
    assert storage_budgets(config, PaskPolicy(table=table), [0.1, 0.1], 2) == pytest.approx(
        [0.1 + 0.25 * cost, 0.1 + cost]
    )
    # Untiered: every token not kept in full is stored (0.9 of them); without low bits, the budget.
    assert storage_budgets(config, PaskPolicy(), [0.1, 0.1], 2) == pytest.approx([0.1 + 0.9 * cost] * 2)
    unstored = PaskConfig(kv_policy="pask", kv_budget=0.1)
    assert storage_budgets(unstored, PaskPolicy(table=table), [0.1, 0.1], 2) == [0.1, 0.1]
