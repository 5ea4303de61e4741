"""bench.memory's server flags: the 2-bit mode and a PASK policy file reach only the servers they apply to."""

from bench.memory import build_parser, server_flags


def test_kv_dropped_and_pask_policy_reach_only_their_configurations():
    args = build_parser().parse_args(
        ["--kv-dropped", "2bit", "--pask-policy", "p.json", "--server-args", "--kv-decode keep"]
    )
    full = server_flags("m", "full", 1.0, args)
    assert "--kv-dropped" not in full and "--pask-policy" not in full
    snapkv = server_flags("m", "snapkv", 0.175, args)
    assert snapkv[snapkv.index("--kv-dropped") + 1] == "2bit" and "--pask-policy" not in snapkv
    pask = server_flags("m", "pask", 0.175, args)
    assert pask[pask.index("--pask-policy") + 1] == "p.json" and "--kv-decode" in pask
    assert server_flags("m", "snapkv", 0.2, build_parser().parse_args([]))[-2:] == ["--kv-dropped", "drop"]


def test_full_kv_serves_kv_decode_lowbit_as_keep():
    for decode in (["--kv-decode", "lowbit"], ["--kv-decode=lowbit"]):
        args = build_parser().parse_args(
            ["--kv-dropped", "k4v2", "--server-args", " ".join(decode + ["--x", "lowbit"])]
        )
        full = server_flags("m", "full", 1.0, args)
        assert "lowbit" not in full[:-2] and full[-2:] == ["--x", "lowbit"]
        assert "--kv-decode keep" in " ".join(full) or "--kv-decode=keep" in full
        assert " ".join(decode) in " ".join(server_flags("m", "pask", 0.02, args))


def test_slot_breakdown_splits_held_positions_by_where_they_are():
    from bench.memory import slot_breakdown

    # Two groups; prompt of 6 tokens, the first 4 matched from the cache, 2 generated (8 in all).
    stats = {
        "full_tokens": 8,
        "kept_positions": [[0, 1, 5, 6, 7], [0, 4, 7]],
        "lowbit_positions": [[2, 3, 4], [1, 2, 3, 5, 6]],
        "lowbit_slots": [8, 16],
    }
    result = {"meta_info": {"cached_tokens": 4, "prompt_tokens": 6, "kv_stats": stats}}
    b = slot_breakdown([result])
    assert b.tokens == 8 and b.matched_prefix_tokens == 4
    assert b.full_in_matched_prefix == (2 + 1) / 2
    assert b.full_in_rest_of_prompt == (1 + 1) / 2
    assert b.full_in_generated == (2 + 1) / 2
    assert b.lowbit_tokens == (3 + 5) / 2 and b.lowbit_slots == (8 + 16) / 2


def test_slot_breakdown_without_lowbit_fields_counts_no_lowbit_slots():
    from bench.memory import slot_breakdown

    result = {"meta_info": {"prompt_tokens": 3, "kv_stats": {"full_tokens": 4, "kept_positions": [[0, 3]]}}}
    b = slot_breakdown([result])
    assert b.matched_prefix_tokens == 0 and b.full_in_rest_of_prompt == 1 and b.full_in_generated == 1
    assert b.lowbit_tokens == 0 and b.lowbit_slots == 0


def test_block_places_are_averaged_and_shown_in_slots():
    from bench.memory import ConfigMemory, format_block_places, slot_breakdown

    places = [
        {"blocks": 2, "passes": 1, "row_tokens": 40, "other_rows": 8, "freed": 0, "never_filled": 16},
        {"blocks": 1, "passes": 1, "row_tokens": 20, "other_rows": 0, "freed": 4, "never_filled": 8},
    ]
    stats = {
        "full_tokens": 70,
        "kept_positions": [[0], [0]],
        "lowbit_positions": [list(range(40)), list(range(20))],
        "lowbit_slots": [16, 8],
        "lowbit_block_places": places,
    }
    b = slot_breakdown([{"meta_info": {"cached_tokens": 0, "prompt_tokens": 60, "kv_stats": stats}}])
    assert (b.lowbit_blocks, b.lowbit_passes) == (1.5, 1.0)
    assert (b.places_other_rows, b.places_freed, b.places_never_filled) == (4.0, 2.0, 12.0)
    row = ConfigMemory("pask", 0.02, 1, 1.0, 1.0, 1.0, 1, [1], [1], 1, 1.0, 1.0, breakdown=b)
    # 8 slots per block of 32 places: the 18 places that are not the request's take 4.5 slots.
    assert format_block_places([row]).splitlines()[-1] == "| pask | 0.02 | 1.5 | 1.00 | 4.0 | 2.0 | 12.0 | 4.5 |"
