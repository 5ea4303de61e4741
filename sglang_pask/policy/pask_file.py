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
      "lowbit": [[0.0, 0.5, ...], ...],                         # optional (tiered): per group, per role,
                                                                #   share kept at low bits after the floor
      "lowbit_format": "k4v2",                                  # with "lowbit": the --kv-dropped it needs
      "kv_bytes": 0.15,                                         # with "lowbit": the bytes it was solved for
      "kv_budget": 0.02,                                        # with "lowbit": the --kv-budget it serves at
      "calibration": {...}                                      # settings, data and measurements
    }

:func:`load_policy_file` checks a file against the served model (name when known, layer count, layer
groups) and raises :class:`PolicyFileError` naming the file and the problem. A role the file does not
list takes the floor of the role it refines (:data:`~sglang_pask.structure.roles.REFINES`): a file
calibrated before the role existed counted those tokens as that role. Any other unlisted role has floor 0.
A tiered file (with ``"lowbit"``) is served only with ``--kv-dropped`` equal to its ``"lowbit_format"``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional, Sequence

from sglang_pask.config import KV_DROPPED_BITS
from sglang_pask.structure.roles import REFINES, Role

from .pask import PaskTable

FORMAT = "sglang-pask-policy"
VERSION = 1
#: The ``--kv-dropped`` formats a tiered file's low-bit tier can be stored in.
LOWBIT_FORMATS = tuple(KV_DROPPED_BITS)

#: The ``--kv-decode`` mode a policy file must be calibrated for, by the server's mode: under ``lowbit``
#: decode stores generated tokens by age, not by the policy, so the policy decides the prompt only, as
#: under ``keep``.
CALIBRATED_DECODE = {"compress": "compress", "keep": "keep", "lowbit": "keep"}


class PolicyFileError(ValueError):
    """A PASK policy file is malformed or does not fit the served model."""


@dataclass(frozen=True)
class Tiers:
    """What a tiered policy file adds to its table: the low-bit format its ``lowbit`` shares are
    stored in (a ``--kv-dropped`` mode), the share of full KV's bytes it was solved for, and the
    ``--kv-budget`` (full-precision share) it serves at."""

    lowbit_format: str
    kv_bytes: float
    kv_budget: float


def table_to_json(
    table: PaskTable,
    model_name: str,
    layer_ranges: Sequence[range],
    calibration: dict[str, Any],
    tiers: Optional[Tiers] = None,
) -> dict[str, Any]:
    """The file form of ``table`` (see the module docstring); ``tiers`` when ``table.lowbit`` is set."""
    if (tiers is None) != (table.lowbit is None):
        raise ValueError("a tiered table (lowbit shares) and its Tiers go together")
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
        **(
            {
                "lowbit": [list(row) for row in table.lowbit or ()],
                "lowbit_format": tiers.lowbit_format,
                "kv_bytes": tiers.kv_bytes,
                "kv_budget": tiers.kv_budget,
            }
            if tiers is not None
            else {}
        ),
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
    kv_dropped: Optional[str] = None,
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
    kv_dropped : str, optional
        The server's ``--kv-dropped``; checked when given against a tiered file's ``lowbit_format``.

    Raises
    ------
    PolicyFileError
        If the file cannot be read, is not a version-1 policy file, is malformed, or was calibrated
        for another model, layer count, grouping or decode mode.
    """
    where = f"PASK policy file {path}"
    data = _read(path)
    tiers = _tiers(data, where)
    try:
        model = data["model"]
        file_layers = int(model["num_layers"])
        groups = [range(int(a), int(b) + 1) for a, b in data["layer_groups"]]
        columns = [Role.from_label(label) for label in data["roles"]]
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
    if tiers is not None and kv_dropped is not None and kv_dropped != tiers.lowbit_format:
        raise PolicyFileError(
            f"{where}: its low-bit tier is stored as {tiers.lowbit_format}, the server runs --kv-dropped {kv_dropped} "
            f"(serve it with --kv-dropped {tiers.lowbit_format})"
        )
    rows = [data["floors"]] + ([data["lowbit"]] if tiers is not None else [])
    if any(len(row) != len(columns) for table in rows for row in table) or any(len(t) != len(groups) for t in rows):
        raise PolicyFileError(
            f'{where}: every row of "floors" (and "lowbit") needs one value per entry of "roles", one row per layer group'
        )
    by_label = [[dict(zip(columns, map(float, row))) for row in table] for table in rows]

    def by_role(table: list[dict]) -> tuple[tuple[float, ...], ...]:
        return tuple(tuple(row.get(role, row.get(REFINES.get(role), 0.0)) for role in Role) for row in table)

    try:
        return PaskTable(
            floors=by_role(by_label[0]),
            lowbit=by_role(by_label[1]) if tiers is not None else None,
            residual_shares=shares,
            layers_per_group=tuple(len(r) for r in groups),
            role_frequencies=tuple(frequencies.get(role, 0.0) for role in Role),
            sinks=data.get("sinks", 0),
        )
    except ValueError as err:
        raise PolicyFileError(f"{where}: {err}") from None


def _read(path: str | Path) -> dict[str, Any]:
    """The JSON object of a version-1 policy file; PolicyFileError naming the file otherwise."""
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
    return data


def _tiers(data: dict[str, Any], where: str) -> Optional[Tiers]:
    if "lowbit" not in data:
        return None
    try:
        tiers = Tiers(str(data["lowbit_format"]), float(data["kv_bytes"]), float(data["kv_budget"]))
    except (KeyError, TypeError, ValueError) as err:
        raise PolicyFileError(
            f'{where}: a tiered file ("lowbit") needs "lowbit_format", "kv_bytes" and "kv_budget" '
            f"({type(err).__name__}: {err})"
        ) from None
    if tiers.lowbit_format not in LOWBIT_FORMATS:
        raise PolicyFileError(
            f'{where}: "lowbit_format" must be one of {list(LOWBIT_FORMATS)}, got {tiers.lowbit_format!r}'
        )
    if not (0 < tiers.kv_bytes <= 1 and 0 < tiers.kv_budget <= 1):
        raise PolicyFileError(f'{where}: "kv_bytes" and "kv_budget" must be in (0, 1]')
    return tiers


def policy_file_tiers(path: str | Path) -> Optional[Tiers]:
    """The :class:`Tiers` of a tiered policy file, None for an untiered one.

    Raises
    ------
    PolicyFileError
        If the file cannot be read or its tier fields are malformed.
    """
    return _tiers(_read(path), f"PASK policy file {path}")
