"""The SGLang seam: the only part of sglang-pask that imports sglang (pinned: sglang 0.5.23).

Modules here are glue: hooks, SGLang subclasses and the model-loop hook that wire the pure layers
(:mod:`sglang_pask.structure`, :mod:`sglang_pask.policy`, :mod:`sglang_pask.structkv`,
:mod:`sglang_pask.kvpool`, :mod:`sglang_pask.api`) into SGLang's seams.

- :mod:`.hooks`: registers every hook below with SGLang's ``HookRegistry``.
- :mod:`.server`: starts SGLang's HTTP server (for :mod:`sglang_pask.launch_server`).
- Requests and responses: :mod:`.contract` (what the tokenizer manager accepts), :mod:`.grammar`
  (the xgrammar backend with a role track per request), :mod:`.roles` (roles and probes of a
  running request's positions), :mod:`.output` (the response fields the scheduler sends).
- The layer-group KV pool: :mod:`.pool` (SGLang's MHA pool and token allocator, per group),
  :mod:`.configurator` (built where SGLang builds its KV cache), :mod:`.active_pool` (the process's
  pool and its usage), :mod:`.rows` (request rows entering and leaving it), :mod:`.admission`
  (prefill admission per group), :mod:`.leak_check` (the idle leak check), :mod:`.metrics`
  (Prometheus gauges).
- :mod:`.attention`: the attention backends reading each group's view.
- :mod:`.model_loop`: StructKV's layer loop for Qwen2, Qwen3 and Llama models.
"""
