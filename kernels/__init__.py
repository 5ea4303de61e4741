"""Triton kernels of sglang-pask, importable as ``sglang_pask.kernels`` (pyproject maps this folder).

Each kernel module sits beside its plain-torch reference and is tested against it on CPU under
``TRITON_INTERPRET=1``.

- ``window_scores``: the attention mass the last ``window`` queries of each sequence pay to every key,
  recomputed from the token pool (fused attention kernels do not return weights): the scores of
  SnapKV, H2O and StructKV.
- ``skeleton_gather``: StructKV's prefill pruning: the skeleton rows of a packed extend batch (hidden
  states, residual, positions) gathered for the layers after the pivot, and scattered back.
"""
