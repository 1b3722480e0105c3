"""``pyarrow.compute``, imported when a kernel is first used.

Importing ``pyarrow.compute`` builds a Python wrapper for each of its ~300 kernels (docstrings
parsed, signatures made): 60-120 ms of CPU, a tenth of a ``consume-snapshot`` restart, which
(caught up, nothing new to apply) runs no kernel at all. The modules of the consumers' path (and
core's) take ``pc`` from here instead (``from deltamirror.core.compute import pc``; the type
checker sees the module itself), and ``pc.equal(...)`` then imports the module on its first call. Each name is looked up once and
kept on the stand-in, so later calls cost what an attribute of the module costs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any


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

__all__ = ["pc"]
