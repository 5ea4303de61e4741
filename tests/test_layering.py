"""The layering holds: only the SGLang seam imports sglang, and the pure packages import without it.

DESIGN.md, "Layers of the code": ``sglang_pask/srt/`` is the only place that imports sglang (with the
plugin entry point and the CPU stand-ins, which SGLang's own imports need); everything below it is
pure and must stay importable where sglang is absent.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest
import tomllib

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "sglang_pask"
KERNELS = ROOT / "kernels"  # importable as sglang_pask.kernels

# Where importing the ``sglang`` package is allowed (paths relative to the repository root).
SEAM = ("sglang_pask/srt/", "sglang_pask/compat/", "sglang_pask/plugin.py")
# Packages that must import with sglang absent: every module in each.
PURE_PACKAGES = (
    "sglang_pask.api",
    "sglang_pask.kvpool",
    "sglang_pask.policy",
    "sglang_pask.structkv",
    "sglang_pask.structure",
    "sglang_pask.kernels",
)


def _sglang_imports(path: Path) -> list[str]:
    """``line: module`` of every ``import sglang...`` / ``from sglang... import`` in ``path``
    (anywhere, function bodies included); ``sglang_pask`` and relative imports are not sglang."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module is not None:
            names = [node.module]
        else:
            continue
        found += [f"{node.lineno}: {name}" for name in names if name == "sglang" or name.startswith("sglang.")]
    return found


def _sources() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py")) + sorted(KERNELS.rglob("*.py"))


def test_only_the_seam_imports_sglang():
    offenders = {}
    for path in _sources():
        relative = path.relative_to(ROOT).as_posix()
        if relative.startswith(SEAM):
            continue
        found = _sglang_imports(path)
        if found:
            offenders[relative] = found
    assert offenders == {}, f"modules outside {SEAM} import sglang: {offenders}"


def test_the_seam_check_sees_sglang_imports(tmp_path):
    """The check itself: it finds both import forms, in function bodies too, and not sglang_pask."""
    module = tmp_path / "m.py"
    module.write_text(
        "import sglang_pask.srt\nfrom sglang_pask import api\n"
        "def f():\n    import sglang.srt.utils\n    from sglang import launch_server\n"
    )
    assert _sglang_imports(module) == ["4: sglang.srt.utils", "5: sglang"]


def _modules(package: str) -> list[str]:
    """Every module of ``package`` (the package itself included), by its folder."""
    folder = KERNELS if package == "sglang_pask.kernels" else ROOT / package.replace(".", "/")
    names = []
    for path in sorted(folder.rglob("*.py")):
        parts = list(path.relative_to(folder).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        names.append(".".join([package, *parts]))
    return names


@pytest.mark.parametrize("package", PURE_PACKAGES)
def test_pure_packages_import_without_sglang(package):
    modules = _modules(package)
    script = (
        "import importlib, sys\n"
        "sys.modules['sglang'] = None  # any import of sglang or its submodules now fails\n"
        f"for name in {modules!r}:\n"
        "    importlib.import_module(name)\n"
        "assert not [m for m in sys.modules if m.startswith('sglang.')], 'a submodule of sglang was imported'\n"
    )
    result = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, f"{package} needs sglang:\n{result.stderr[-3000:]}"


def test_every_package_is_in_the_wheel():
    """pyproject lists packages explicitly (kernels/ is mapped in): a new subpackage must be added there."""
    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    folders = {".".join(p.parent.relative_to(ROOT).parts) for p in PACKAGE.rglob("__init__.py")}
    folders |= {"sglang_pask.kernels"} if (KERNELS / "__init__.py").exists() else set()
    missing = folders - listed
    assert missing == set(), f"packages missing from pyproject's [tool.setuptools] packages: {missing}"
