"""deltamirror.cli: the `deltamirror` command, the composition root of core, producer and consumer."""
