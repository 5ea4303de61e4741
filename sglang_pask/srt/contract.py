"""What the tokenizer manager accepts: SGLang's request checks, extended with this project's fields.

* ``return_kv_roles`` and ``return_kv_kept`` (sampling parameters, :mod:`sglang_pask.api.flags`):
  :func:`sampling_params_with_flags` is the manager's ``SamplingParams`` factory that carries them
  in ``custom_params``, and the ``/generate`` contract check accepts them if they are true or false;
* ``custom_params["pask_probe"]``, a calibration request's probe (:mod:`sglang_pask.api.probe`):
  checked here so that a malformed probe is a clear HTTP 400, not a scheduler-side surprise;

and, after tokenization, prompts that SGLang 0.5.23 accepts and whose extend pass then kills the
scheduler (stock SGLang on the CPU engine included): a text of no tokens (``"text": ""``; SGLang
refuses ``"input_ids": []`` itself) and ``input_ids`` outside the model's vocabulary.
:func:`reject_unservable_prompt` makes both an HTTP 400.
"""

from __future__ import annotations

from typing import Any, Optional

from sglang.srt.sampling.sampling_params import SamplingParams

from sglang_pask.api.flags import FLAGS, flag_error
from sglang_pask.api.probe import ALL_GROUPS_LABEL, PROBE_PARAM, probe_error
from sglang_pask.config import PaskConfig


def contract_error(original: Any, body: Any) -> Optional[str]:
    """AROUND hook of ``api_contract.generate_contract_error``: per-prompt lists that do not match the
    batch (:func:`batch_shape_error`), probes, then the flags (:func:`contract_error_with_flags`)."""
    if isinstance(body, dict):
        error = batch_shape_error(body)
        if error is not None:
            return error
        params = body.get("sampling_params")
        for p in params if isinstance(params, list) else [params]:
            custom = p.get("custom_params") if isinstance(p, dict) else None
            if isinstance(custom, dict) and PROBE_PARAM in custom:
                error = probe_error(custom[PROBE_PARAM]) or _group_error(custom[PROBE_PARAM])
                if error is not None:
                    return error
    return contract_error_with_flags(original, body)


# /generate fields that may be one value for every prompt or a list with one value per prompt;
# SGLang 0.5.23 indexes such a list by prompt without checking its length (an IndexError, HTTP 500).
PER_PROMPT_FIELDS = (
    "sampling_params",
    "return_logprob",
    "logprob_start_len",
    "top_logprobs_num",
    "return_sampling_mask",
    "sampling_logprobs_mode",
    "custom_logit_processor",
)


def batch_shape_error(body: dict) -> Optional[str]:
    """Why a ``/generate`` body's per-prompt lists (:data:`PER_PROMPT_FIELDS`) do not fit its prompts,
    or None: a batch (``text`` a list, or ``input_ids`` a list of lists) needs one entry per prompt in
    each such list; a single prompt takes none of them as a list."""
    text, input_ids = body.get("text"), body.get("input_ids")
    if isinstance(text, list):
        prompts, source = len(text), "text"
    elif isinstance(input_ids, list) and input_ids and isinstance(input_ids[0], list):
        prompts, source = len(input_ids), "input_ids"
    elif text is not None or input_ids is not None:
        prompts, source = None, None
    else:
        return None
    for field in PER_PROMPT_FIELDS:
        value = body.get(field)
        if not isinstance(value, list):
            continue
        if prompts is None:
            return f"{field} is a list, but the request has a single prompt: send one value, not a list"
        if len(value) != prompts:
            return (
                f"{field} has {len(value)} entries but the batch has {prompts} prompts ({source}): "
                "send one entry per prompt, or a single value for all"
            )
    return None


def _group_error(probe: dict) -> Optional[str]:
    """Why a probe's ``drop_group`` names no layer group of this server, or None."""
    config = PaskConfig.from_env()
    if config is None or "drop_group" not in probe or probe["drop_group"] == ALL_GROUPS_LABEL:
        return None
    spec = config.kv_layer_groups
    groups = spec.count if spec.count is not None else len(spec.ranges or ())
    if probe["drop_group"] >= groups:
        return f"{PROBE_PARAM}: drop_group {probe['drop_group']} is not a layer group of this server (it has {groups})"
    return None


def sampling_params_with_flags(**kwargs: Any) -> SamplingParams:
    """SGLang's SamplingParams, accepting the :data:`~sglang_pask.api.flags.FLAGS` (carried in
    ``custom_params``)."""
    given = {name: kwargs.pop(name, None) for name in FLAGS}
    carried = {name: value for name, value in given.items() if value is not None}
    for name, value in carried.items():
        error = flag_error(name, value)
        if error is not None:
            raise ValueError(error)
    if carried:
        kwargs["custom_params"] = {**(kwargs.get("custom_params") or {}), **carried}
    return SamplingParams(**kwargs)


def contract_error_with_flags(original: Any, body: Any) -> Optional[str]:
    """SGLang's ``/generate`` contract check where the :data:`~sglang_pask.api.flags.FLAGS` are known
    sampling parameters (true or false); everything else is checked by SGLang as before."""
    if not isinstance(body, dict):
        return original(body)
    params = body.get("sampling_params")
    param_list = params if isinstance(params, list) else [params]
    if not any(isinstance(p, dict) and any(name in p for name in FLAGS) for p in param_list):
        return original(body)
    stripped = []
    for p in param_list:
        if isinstance(p, dict):
            for name in FLAGS:
                if name in p:
                    error = flag_error(name, p[name])
                    if error is not None:
                        return error
            p = {k: v for k, v in p.items() if k not in FLAGS}
        stripped.append(p)
    return original({**body, "sampling_params": stripped if isinstance(params, list) else stripped[0]})


def reject_unservable_prompt(manager: Any, obj: Any, input_ids: Optional[list[int]], *args: Any, **kwargs: Any) -> None:
    """BEFORE hook of ``TokenizerManager._validate_one_request``: refuse prompts the engine would die on.

    Raises
    ------
    ValueError
        If the request has no prompt tokens and nothing else (images, audio, video, embeddings) to
        fill them, or a prompt token id outside ``[0, vocab_size)``; SGLang answers the ValueError
        with HTTP 400 and the message.
    """
    if input_ids is None:
        return None
    if len(input_ids) == 0:
        if any(getattr(obj, field, None) is not None for field in _NON_TEXT_INPUTS):
            return None
        raise ValueError("the prompt is empty (0 tokens): send a non-empty text or input_ids")
    vocab_size = manager.model_config.vocab_size
    low, high = min(input_ids), max(input_ids)
    if low < 0 or high >= vocab_size:
        bad = low if low < 0 else high
        raise ValueError(f"input_ids holds the token id {bad}, outside the model's vocabulary [0, {vocab_size})")
    return None


_NON_TEXT_INPUTS = ("input_embeds", "image_data", "video_data", "audio_data")
