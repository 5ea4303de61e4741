"""bench.memory's server flags: the 2-bit mode and a PASK policy file reach only the servers they apply to."""

from bench.memory import build_parser, server_flags


def test_kv_dropped_and_pask_policy_reach_only_their_configurations():
    args = build_parser().parse_args(["--kv-dropped", "2bit", "--pask-policy", "p.json",
                                      "--server-args", "--kv-decode keep"])
    full = server_flags("m", "full", 1.0, args)
    assert "--kv-dropped" not in full and "--pask-policy" not in full
    snapkv = server_flags("m", "snapkv", 0.175, args)
    assert snapkv[snapkv.index("--kv-dropped") + 1] == "2bit" and "--pask-policy" not in snapkv
    pask = server_flags("m", "pask", 0.175, args)
    assert pask[pask.index("--pask-policy") + 1] == "p.json" and "--kv-decode" in pask
    assert server_flags("m", "snapkv", 0.2, build_parser().parse_args([]))[-2:] == ["--kv-dropped", "drop"]
