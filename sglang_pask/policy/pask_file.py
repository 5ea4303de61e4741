"""PASK policy files: the calibrated table as a versioned, documented JSON file.

Format (``"format": "sglang-pask-policy"``, ``"version": 1``)::

    {
      "format": "sglang-pask-policy",
      "version": 1,
      "model": {"name": "Qwen2.5-Coder-0.5B-Instruct", "num_layers": 24},
      "layer_groups": [[0, 5], [6, 11], [12, 17], [18, 23]],   # inclusive layer ranges
      "roles": ["whitespace", "boundary", ...],                 # column order of "floors"
      "floors": [[0.0, 0.5, ...], ...],                         # per group, per role, in [0, 1]
      "residual_shares": [0.3, 0.25, 0.25, 0.2],                # per group, summing to 1
      "role_frequencies": {"whitespace": 0.04, ...},            # share of tokens per role
      "sinks": 4,                                               # optional: first positions always kept
      "calibration": {...}                                      # settings, data and measurements
    }

:func:`load_policy_file` checks a file against the served model (name when known, layer count, layer
groups) and raises :class:`PolicyFileError` naming the file and the problem. A role the file does not
list takes the floor of the role it refines (:data:`~sglang_pask.structure.roles.REFINES`): a file
calibrated before the role existed counted those tokens as that role. Any other unlisted role has floor 0.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Optional, Sequence

from sglang_pask.structure.roles import REFINES, Role

from .pask import PaskTable

FORMAT = "sglang-pask-policy"
VERSION = 1

#: The ``--kv-decode`` mode a policy file must be calibrated for, by the server's mode: under ``lowbit``
#: decode stores generated tokens by age, not by the policy, so the policy decides the prompt only, as
#: under ``keep``.
CALIBRATED_DECODE = {"compress": "compress", "keep": "keep", "lowbit": "keep"}


class PolicyFileError(ValueError):
    """A PASK policy file is malformed or does not fit the served model."""


def table_to_json(
    table: PaskTable, model_name: str, layer_ranges: Sequence[range], calibration: dict[str, Any]
) -> dict[str, Any]:
    """The file form of ``table`` (see the module docstring)."""
    labels = [role.label for role in Role]
    return {
        "format": FORMAT,
        "version": VERSION,
        "model": {"name": model_name, "num_layers": sum(len(r) for r in layer_ranges)},
        "layer_groups": [[r[0], r[-1]] for r in layer_ranges],
        "roles": labels,
        "floors": [list(row) for row in table.floors],
        "residual_shares": list(table.residual_shares),
        "role_frequencies": dict(zip(labels, table.role_frequencies)),
        **({"sinks": table.sinks} if table.sinks else {}),
        "calibration": calibration,
    }


def save_policy_file(path: str | Path, data: dict[str, Any]) -> None:
    """Write a policy file (pretty-printed JSON), creating its folder if needed."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(data, indent=2) + "\n")


def load_policy_file(
    path: str | Path,
    num_layers: int,
    layer_ranges: Sequence[range],
    model_name: Optional[str] = None,
    kv_decode: Optional[str] = None,
) -> PaskTable:
    """Read, check and convert a policy file for the served model.

    Parameters
    ----------
    path : str or Path
        The file.
    num_layers : int
        The served model's layer count.
    layer_ranges : sequence of range
        The server's layer groups.
    model_name : str, optional
        The served model's name (its folder name); checked when given.
    kv_decode : str, optional
        The server's ``--kv-decode``; checked when given against the mode the file was calibrated
        for (``calibration.kv_decode``; ``compress`` when the file does not say): its floors were
        fitted to the tokens that mode compresses.

    Raises
    ------
    PolicyFileError
        If the file cannot be read, is not a version-1 policy file, is malformed, or was calibrated
        for another model, layer count, grouping or decode mode.
    """
    where = f"PASK policy file {path}"
    try:
        data = json.loads(Path(path).read_text())
    except OSError as err:
        raise PolicyFileError(f"{where}: cannot read it ({err.strerror})") from None
    except json.JSONDecodeError as err:
        raise PolicyFileError(f"{where}: not valid JSON ({err})") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise PolicyFileError(f'{where}: not a policy file ("format" must be {FORMAT!r})')
    if data.get("version") != VERSION:
        raise PolicyFileError(f"{where}: version {data.get('version')!r} is not supported (expected {VERSION})")
    try:
        model = data["model"]
        file_layers = int(model["num_layers"])
        groups = [range(int(a), int(b) + 1) for a, b in data["layer_groups"]]
        columns = [Role.from_label(label) for label in data["roles"]]
        floors_by_label = [dict(zip(columns, map(float, row))) for row in data["floors"]]
        shares = tuple(float(s) for s in data["residual_shares"])
        frequencies = {Role.from_label(k): float(v) for k, v in data["role_frequencies"].items()}
    except (KeyError, TypeError, ValueError) as err:
        raise PolicyFileError(f"{where}: malformed ({type(err).__name__}: {err})") from None
    if model_name is not None and model.get("name") != model_name:
        raise PolicyFileError(
            f"{where}: calibrated for model {model.get('name')!r}, but the server runs {model_name!r}"
        )
    if file_layers != num_layers:
        raise PolicyFileError(f"{where}: calibrated for a {file_layers}-layer model, the served model has {num_layers}")
    if [(r[0], r[-1]) for r in groups] != [(r[0], r[-1]) for r in layer_ranges]:
        raise PolicyFileError(
            f"{where}: calibrated for layer groups {[[r[0], r[-1]] for r in groups]}, the server has "
            f"{[[r[0], r[-1]] for r in layer_ranges]} (--kv-layer-groups)"
        )
    calibrated_mode = (data.get("calibration") or {}).get("kv_decode", "compress")
    wanted = CALIBRATED_DECODE.get(kv_decode, kv_decode) if kv_decode is not None else None
    if wanted is not None and calibrated_mode != wanted:
        uses = f", which uses policies calibrated for {wanted}" if wanted != kv_decode else ""
        raise PolicyFileError(
            f"{where}: calibrated for --kv-decode {calibrated_mode}, the server runs --kv-decode {kv_decode}{uses} "
            f"(refit it: python -m sglang_pask.calibrate --refit {path} --kv-decode {wanted} --out NEW.json)"
        )
    if any(len(row) != len(columns) for row in data["floors"]):
        raise PolicyFileError(f'{where}: every row of "floors" needs one value per entry of "roles"')
    try:
        return PaskTable(
            floors=tuple(
                tuple(row.get(role, row.get(REFINES.get(role), 0.0)) for role in Role) for row in floors_by_label
            ),
            residual_shares=shares,
            layers_per_group=tuple(len(r) for r in groups),
            role_frequencies=tuple(frequencies.get(role, 0.0) for role in Role),
            sinks=data.get("sinks", 0),
        )
    except ValueError as err:
        raise PolicyFileError(f"{where}: {err}") from None
