"""CPU stand-ins for sgl_kernel and torchvision: used only when the real module cannot load."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path


def run_python(code: str, extra_path: Path | None = None) -> subprocess.CompletedProcess:
    """Run ``code`` in a fresh interpreter (the .pth file installs the finder at start-up)."""
    env_path = [str(extra_path)] if extra_path else []
    prelude = f"import sys; sys.path[:0] = {env_path!r}\n"
    return subprocess.run(
        [sys.executable, "-c", prelude + textwrap.dedent(code)], capture_output=True, text=True, timeout=120
    )


def test_finder_is_installed_at_interpreter_start():
    result = run_python(
        """
        import sys
        from sglang_pask.compat.standins import StandInFinder
        assert any(isinstance(f, StandInFinder) for f in sys.meta_path)
        print("ok")
        """
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"


def test_sgl_kernel_standin_when_no_real_module(tmp_path):
    result = run_python(
        """
        import sgl_kernel, torch
        assert sgl_kernel.IS_SGLANG_PASK_STANDIN
        try:
            sgl_kernel.copy_all_layer_kv_cache_cpu(1, 2)
        except NotImplementedError as err:
            assert "sgl_kernel.copy_all_layer_kv_cache_cpu" in str(err) and "stand-in" in str(err)
        else:
            raise AssertionError("a stand-in kernel must not run")
        try:
            from sgl_kernel.scalar_type import scalar_types  # SGLang guards this with ImportError
        except ImportError:
            pass
        else:
            raise AssertionError("stand-in must not have submodules")
        assert not hasattr(torch.ops.sgl_kernel, "convert_weight_packed")  # no ops: AMX paths stay off
        print("ok")
        """,
        extra_path=tmp_path,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"


def test_real_module_wins_when_it_loads(tmp_path):
    (tmp_path / "sgl_kernel").mkdir()
    (tmp_path / "sgl_kernel" / "__init__.py").write_text("REAL = True\n")
    result = run_python(
        "import sgl_kernel; print(sgl_kernel.REAL, hasattr(sgl_kernel, 'IS_SGLANG_PASK_STANDIN'))", tmp_path
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "True False"


def test_broken_real_module_falls_back_to_the_standin(tmp_path):
    (tmp_path / "sgl_kernel").mkdir()
    (tmp_path / "sgl_kernel" / "__init__.py").write_text(
        "raise ImportError('libcuda.so.1: cannot open shared object file')\n"
    )
    result = run_python("import sgl_kernel; print(sgl_kernel.IS_SGLANG_PASK_STANDIN)", tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "True"


def test_torchvision_standin_serves_imports_sglang_needs():
    result = run_python(
        """
        import torchvision.transforms as T
        from torchvision.transforms.functional import InterpolationMode
        import torchvision.transforms.v2.functional as tvF
        assert InterpolationMode.BICUBIC.value == "bicubic"
        try:
            T.Compose([])
        except RuntimeError as err:
            assert "stand-in" in str(err)
        else:
            raise AssertionError("placeholder classes must refuse to run")
        print("ok")
        """
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"
