"""SGLang's attention backends over the layer-group pool: each layer reads its group's view of each request.

- :mod:`.torch_native`: in place of SGLang's ``TorchNativeAttnBackend``.
- :mod:`.triton`: in place of SGLang's ``TritonAttnBackend``.
- :mod:`.reads`: what both do besides attending (read lists, scores, compression), mixed into each.
"""
