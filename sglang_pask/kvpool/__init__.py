"""Which of each request's tokens every layer group keeps, and in which slots (pure torch, no sglang import).

- :mod:`.sizing`: how many physical slots each layer group's pool gets for the bytes of SGLang's
  pool, and the :class:`~.sizing.LayerGroupLayout` the pool is built on.
- :mod:`.views`: a request's view per layer group: the positions its layers read.
- :mod:`.scores`: the attention scores a view carries for its policy, folded step by step.
- :mod:`.compression`: :class:`~.compression.KVViewTable`, the running requests' views and when and
  what each group drops.
- :mod:`.probe`: calibration probes (drop one role, measure distortion), used only by calibration
  requests.
- :mod:`.lowbit`: ``--kv-dropped 2bit|k4v2``: dropped tokens kept as low-bit blocks in the group's slots.

The SGLang side (the pool and allocator classes, the attention backends that drive the views) is in
:mod:`sglang_pask.srt`.
"""
