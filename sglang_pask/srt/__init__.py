"""The only part of sglang-pask that imports sglang (pinned: sglang 0.5.23).

Modules here are glue: they wire the pure-torch layers (structure, policy, structkv) into SGLang's
seams (plugins and hooks, the grammar backend registry, memory pools, attention backends).
"""
