"""CPU stand-ins for ``sgl_kernel`` and ``torchvision``, used only where the real module cannot load.

SGLang 0.5.23 imports two things a CPU-only install cannot provide:

* ``sgl_kernel`` (the CUDA kernels of ``sglang-kernel``): on the CPU engine path
  ``sglang/kernels/ops/kvcache/cache_move.py`` imports it at module level. PyPI has no CPU build,
  and the CUDA build raises ``ImportError: libcuda.so.1`` without a GPU.
* ``torchvision``: ``sglang.srt.configs`` reaches ``sglang/srt/multimodal/internvl_utils.py``, which
  imports ``torchvision.transforms``. PyPI's torchvision wheels are CUDA builds that fail to import
  beside the CPU torch wheel (``operator torchvision::nms does not exist``).

:class:`StandInFinder` sits at the front of ``sys.meta_path``. For each of the two top-level names
it first tries the real module; only if no real module is installed, or it raises while loading,
does it hand out a synthesized stand-in:

* the ``sgl_kernel`` stand-in is one empty module (no submodules, so guarded imports such as
  ``from sgl_kernel.scalar_type import ...`` take SGLang's own ImportError fallbacks) whose
  attributes are functions that raise ``NotImplementedError`` naming the kernel. It registers no
  ``torch.ops.sgl_kernel`` operators, so
  SGLang's capability checks (e.g. ``cpu_has_amx_support()``) report False and its layers take their
  ``forward_native`` torch paths; no stand-in function is called while serving text models.
* the ``torchvision`` stand-in synthesizes any ``torchvision.*`` submodule; attributes are
  placeholder classes that raise when used, and ``InterpolationMode`` is a real enum (modules use it
  at import time).

Neither stand-in does any computation. Multimodal (vision) models cannot be served with them.
"""

from __future__ import annotations

import enum
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import types
from typing import Any, Callable, Optional, Sequence

STANDIN_ROOTS = ("sgl_kernel", "torchvision")


def _missing_kernel(qualified_name: str) -> Callable[..., Any]:
    def kernel(*args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError(
            f"{qualified_name} is a CUDA kernel of sgl_kernel; this process uses the CPU stand-in "
            "from sglang_pask.compat.standins, which has no kernels"
        )

    kernel.__name__ = qualified_name.rsplit(".", 1)[-1]
    kernel.__qualname__ = qualified_name
    return kernel


class InterpolationMode(enum.Enum):
    """Same members and values as ``torchvision.transforms.InterpolationMode``."""

    NEAREST = "nearest"
    NEAREST_EXACT = "nearest-exact"
    BILINEAR = "bilinear"
    BICUBIC = "bicubic"
    BOX = "box"
    HAMMING = "hamming"
    LANCZOS = "lanczos"


def _placeholder_class(qualified_name: str) -> type:
    def unavailable(self: Any, *args: Any, **kwargs: Any) -> None:
        raise RuntimeError(
            f"{qualified_name} is part of the torchvision stand-in (sglang_pask.compat.standins): "
            "torchvision cannot load beside the CPU torch build, so vision models are unsupported"
        )

    return type(qualified_name.rsplit(".", 1)[-1], (), {"__init__": unavailable, "__call__": unavailable})


def _standin_getattr(module_name: str) -> Callable[[str], Any]:
    def module_getattr(attr: str) -> Any:
        if attr.startswith("__"):
            raise AttributeError(attr)
        qualified = f"{module_name}.{attr}"
        if module_name.startswith("sgl_kernel"):
            return _missing_kernel(qualified)
        if attr == "InterpolationMode":
            return InterpolationMode
        return _placeholder_class(qualified)

    return module_getattr


class _StandInLoader(importlib.abc.Loader):
    """Fills a synthesized module; a package (empty ``__path__``), so the finder can add submodules."""

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> Optional[types.ModuleType]:
        return None

    def exec_module(self, module: types.ModuleType) -> None:
        module.__path__ = []
        module.__getattr__ = _standin_getattr(module.__name__)  # type: ignore[attr-defined]
        module.__doc__ = f"CPU stand-in for {module.__name__} (see sglang_pask.compat.standins)."
        module.IS_SGLANG_PASK_STANDIN = True  # type: ignore[attr-defined]
        # transformers parses the version of any torchvision it finds; an old one keeps it off
        # torchvision-only code paths.
        module.__version__ = "0.0.0+sglang_pask_standin"  # type: ignore[attr-defined]


class _AlreadyLoaded(importlib.abc.Loader):
    """Hands back a real module that :class:`StandInFinder` already executed successfully."""

    def __init__(self, module: types.ModuleType) -> None:
        self._module = module

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        return self._module

    def exec_module(self, module: types.ModuleType) -> None:
        return None


class StandInFinder(importlib.abc.MetaPathFinder):
    """Meta-path finder: the real ``sgl_kernel``/``torchvision`` when it loads, else a stand-in."""

    def __init__(self) -> None:
        self._uses_standin: set[str] = set()

    def uses_standin(self, root: str) -> bool:
        """True if ``root`` (a top-level name) was replaced by its stand-in in this process."""
        return root in self._uses_standin

    def find_spec(
        self,
        fullname: str,
        path: Optional[Sequence[str]],
        target: Optional[types.ModuleType] = None,
    ) -> Optional[importlib.machinery.ModuleSpec]:
        root = fullname.partition(".")[0]
        if root not in STANDIN_ROOTS:
            return None
        if root in self._uses_standin:
            if root == "sgl_kernel":
                return None  # no submodules: ModuleNotFoundError, as SGLang's guarded imports expect
            return importlib.util.spec_from_loader(fullname, _StandInLoader(), is_package=True)
        if fullname != root:
            return None  # submodules of a real package are found by the normal finders
        real_spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if real_spec is not None:
            module = self._try_real(real_spec)
            if module is not None:
                return importlib.util.spec_from_loader(fullname, _AlreadyLoaded(module), origin=real_spec.origin)
        self._uses_standin.add(root)
        return importlib.util.spec_from_loader(fullname, _StandInLoader(), is_package=True)

    @staticmethod
    def _try_real(spec: importlib.machinery.ModuleSpec) -> Optional[types.ModuleType]:
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module
        try:
            assert spec.loader is not None
            spec.loader.exec_module(module)
        except Exception:  # noqa: BLE001 - any failure to load the real module means "use the stand-in"
            for name in [n for n in sys.modules if n == spec.name or n.startswith(spec.name + ".")]:
                del sys.modules[name]
            return None
        return module


def install() -> StandInFinder:
    """Put one :class:`StandInFinder` at the front of ``sys.meta_path`` (idempotent)."""
    for finder in sys.meta_path:
        if isinstance(finder, StandInFinder):
            return finder
    finder = StandInFinder()
    sys.meta_path.insert(0, finder)
    return finder
