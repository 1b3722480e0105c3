"""deltamirror.cli: the `deltamirror` command, the composition root of core, producer and consumer.

Its interface is the command itself (``deltamirror --help``; the entry point is
``deltamirror.cli.main:main``), not a Python API: the package exports no names.
"""

__all__: list[str] = []
