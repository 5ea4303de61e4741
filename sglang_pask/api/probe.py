"""``custom_params["pask_probe"]``: a calibration request's probe, checked and parsed.

``python -m sglang_pask.calibrate`` sends each probe as an object with ``drop_group`` (a layer group
index, or ``"all"``) and ``drop_role`` (a role label, or ``"all"`` with ``lowbit``) together, optionally
with ``lowbit`` (``"2bit"`` or ``"k4v2"``: keep those tokens as their low-bit round trip instead of
dropping them), and/or
``distortion_budget`` in (0, 1]. The tokenizer side refuses a malformed one with HTTP 400 (:func:`probe_error`, from
:mod:`sglang_pask.srt.contract`); the scheduler side turns a request's probe into the
:class:`~sglang_pask.kvpool.probe.CalibrationProbe` its views follow (:func:`parse_probe`).

Pure Python (no sglang import).
"""

from __future__ import annotations

from typing import Any, Optional

from sglang_pask.config import KV_DROPPED_BITS
from sglang_pask.kvpool.probe import ALL_GROUPS, ALL_ROLES, CalibrationProbe
from sglang_pask.structure import Role

# custom_params key of a calibration request (python -m sglang_pask.calibrate).
PROBE_PARAM = "pask_probe"
# ``drop_group`` value of a probe that drops its role in every layer group.
ALL_GROUPS_LABEL = "all"
# ``drop_role`` value of a low-bit probe that stores every private token at low bits.
ALL_ROLES_LABEL = "all"
_PROBE_KEYS = ("drop_group", "drop_role", "lowbit", "distortion_budget")


def probe_error(value: Any) -> Optional[str]:
    """Why ``custom_params["pask_probe"]`` is malformed, or None. It is an object with
    ``drop_group`` (a layer group index, or ``"all"``) and ``drop_role`` (a role label, or ``"all"``
    with ``lowbit``) together, optionally with ``lowbit``, and/or ``distortion_budget`` in (0, 1]."""
    if not isinstance(value, dict) or not value or set(value) - {*_PROBE_KEYS}:
        return f"{PROBE_PARAM} must be an object with drop_group and drop_role (and lowbit), and/or distortion_budget"
    if ("drop_group" in value) != ("drop_role" in value):
        return f"{PROBE_PARAM}: drop_group and drop_role go together"
    if "lowbit" in value and ("drop_group" not in value or value["lowbit"] not in KV_DROPPED_BITS):
        return (
            f"{PROBE_PARAM}: lowbit goes with drop_group and is one of {list(KV_DROPPED_BITS)}, got {value['lowbit']!r}"
        )
    if "drop_group" in value:
        group = value["drop_group"]
        if group != ALL_GROUPS_LABEL and (not isinstance(group, int) or isinstance(group, bool) or group < 0):
            return f'{PROBE_PARAM}: drop_group must be a layer group index or "all", got {group!r}'
        if value["drop_role"] == ALL_ROLES_LABEL:
            if "lowbit" not in value:
                return f'{PROBE_PARAM}: drop_role "all" goes with lowbit (dropping every token leaves nothing to read)'
        else:
            try:
                Role.from_label(str(value["drop_role"]))
            except ValueError:
                return f"{PROBE_PARAM}: drop_role {value['drop_role']!r} is not a role"
    budget = value.get("distortion_budget")
    if "distortion_budget" in value and not (isinstance(budget, (int, float)) and 0 < budget <= 1):
        return f"{PROBE_PARAM}: distortion_budget must be in (0, 1], got {budget!r}"
    return None


def parse_probe(custom_params: Any) -> Optional[CalibrationProbe]:
    """The calibration probe of a request's custom params (checked by the API contract), or None."""
    if not isinstance(custom_params, dict) or PROBE_PARAM not in custom_params:
        return None
    value = custom_params[PROBE_PARAM]
    if probe_error(value) is not None:
        return None
    group, role = value.get("drop_group"), value.get("drop_role")
    return CalibrationProbe(
        drop_group=ALL_GROUPS if group == ALL_GROUPS_LABEL else group,
        drop_role=None if role is None else ALL_ROLES if role == ALL_ROLES_LABEL else int(Role.from_label(str(role))),
        distortion_budget=value.get("distortion_budget"),
        lowbit=value.get("lowbit"),
    )
