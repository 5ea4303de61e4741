"""Triton kernels of sglang-pask, importable as ``sglang_pask.kernels`` (pyproject maps this folder).

Each kernel module sits beside its plain-torch reference and is tested against it on CPU under
``TRITON_INTERPRET=1``.

- ``window_scores``: the attention mass the last ``window`` queries of each sequence pay to every key,
  recomputed from the token pool (fused attention kernels do not return weights): the scores of
  SnapKV, H2O and StructKV.
- ``skeleton_gather``: StructKV's prefill pruning: the skeleton rows of a packed extend batch (hidden
  states, residual, positions) gathered for the layers after the pivot, and scattered back.
- ``kv_lowbit``: low-bit KV blocks in KIVI's layout (keys per channel, values per token, 2 or 4 bits),
  plain torch: the packing the layer-group pool stores dropped tokens in.
- ``lowbit_decode_attention``: one decode step's attention over a request's full-precision slots and
  its low-bit blocks, dequantized in registers, in one online softmax.
"""
