"""sglang-pask: parser-aware, per-layer-group KV persistence (PASK) and StructKV inside SGLang.

Importing this package is cheap on purpose (no torch, no sglang): the CPU stand-in finder in
``sglang_pask.compat`` is installed from a ``.pth`` file at every interpreter start.
"""

__version__ = "0.1.0"
