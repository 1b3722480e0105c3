"""Private: tailing."""
