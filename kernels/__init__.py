"""Triton kernels of sglang-pask, importable as ``sglang_pask.kernels`` (pyproject maps this folder).

Each kernel module sits beside its plain-torch reference and is tested against it on CPU under
``TRITON_INTERPRET=1``.
"""
