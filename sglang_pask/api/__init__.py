"""The fields sglang-pask adds to SGLang's ``/generate`` requests and responses (pure Python, no sglang import).

- :mod:`.flags`: the sampling parameters ``return_kv_roles`` and ``return_kv_kept``.
- :mod:`.probe`: ``custom_params["pask_probe"]``, a calibration request's probe.
- :mod:`.kv_stats`: ``meta_info["kv_stats"]``, what the layer groups kept of a request.

Where SGLang takes them in and sends them out (the tokenizer manager's checks, the scheduler's
output streamer) is :mod:`sglang_pask.srt`.
"""
