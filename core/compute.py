"""``pyarrow.compute``, imported when a kernel is first used, and pyarrow imported without NumPy.

Importing ``pyarrow.compute`` builds a Python wrapper for each of its ~300 kernels (docstrings
parsed, signatures made): 60-120 ms of CPU, a tenth of a ``consume-snapshot`` restart, which
(caught up, nothing new to apply) runs no kernel at all. deltamirror's modules take ``pc`` from
here instead (``from deltamirror.core.compute import pc``; the type checker sees the module
itself), and ``pc.equal(...)`` then imports the module on its first call. Each name is looked up
once and kept on the stand-in, so later calls cost what an attribute of the module costs.

NumPy is optional to pyarrow (since pyarrow 16): its extension modules ``pyarrow.lib`` and
``pyarrow._compute`` import it when they can, to convert NumPy arrays, which deltamirror never hands
them. Importing NumPy was 110-170 ms of the 150-220 ms that ``import pyarrow`` cost every command.
:func:`keep_numpy_out_of_pyarrow` (what the command line calls first) has those two modules loaded
with NumPy hidden, whenever they are imported (pyarrow imports ``pyarrow.compute`` itself, for
``Array.filter`` and Parquet filters). NumPy stays importable for anything else in the process;
pyarrow's NumPy conversions are unavailable in it (``Array.to_numpy`` raises). A process that
imported NumPy, or the module, before is left as it is.
"""

from __future__ import annotations

import contextlib
import importlib.abc
import importlib.machinery
import sys
from collections.abc import Iterator, Sequence
from importlib.machinery import ModuleSpec
from types import ModuleType
from typing import TYPE_CHECKING, Any

#: the extension modules of pyarrow that import NumPy when they can
_NUMPY_USERS = ("pyarrow.lib", "pyarrow._compute")


class _NumpyHidden(importlib.abc.Loader):
    """Loads a module as ``inner`` does, while ``import numpy`` raises ImportError (for as long as
    the module's own import runs: another thread importing NumPy then would fail too, and nothing
    in deltamirror's commands does)."""

    def __init__(self, inner: importlib.abc.Loader) -> None:
        self._inner = inner

    def create_module(self, spec: ModuleSpec) -> ModuleType | None:
        with _numpy_hidden():
            return self._inner.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        with _numpy_hidden():
            self._inner.exec_module(module)


@contextlib.contextmanager
def _numpy_hidden() -> Iterator[None]:
    if "numpy" in sys.modules:  # imported already (or hidden by an outer load): as it is
        yield
        return
    sys.modules["numpy"] = None  # type: ignore[assignment]  # `import numpy` raises ImportError
    try:
        yield
    finally:
        if "numpy" in sys.modules and sys.modules["numpy"] is None:
            del sys.modules["numpy"]


class _NumpyFreePyarrow(importlib.abc.MetaPathFinder):
    """Finds pyarrow's NumPy-using modules as the path finder does, to be loaded with NumPy hidden."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> ModuleSpec | None:
        if fullname not in _NUMPY_USERS or "numpy" in sys.modules:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path, target)
        if spec is None or spec.loader is None:
            return None
        spec.loader = _NumpyHidden(spec.loader)
        return spec


def keep_numpy_out_of_pyarrow() -> None:
    """From now on, pyarrow's modules that would import NumPy are loaded with NumPy hidden (see the
    module docstring); nothing is imported here. Idempotent."""
    if not any(isinstance(f, _NumpyFreePyarrow) for f in sys.meta_path):
        sys.meta_path.insert(0, _NumpyFreePyarrow())


class _Compute:
    """Stands in for ``pyarrow.compute`` until a name of it is asked for."""

    def __getattr__(self, name: str) -> Any:
        import pyarrow.compute as module

        value = getattr(module, name)
        setattr(self, name, value)
        return value

    def __repr__(self) -> str:
        return "<pyarrow.compute, imported on first use>"


if TYPE_CHECKING:  # the checker sees the module itself
    import pyarrow.compute as pc
else:
    pc = _Compute()

__all__ = ["keep_numpy_out_of_pyarrow", "pc"]
