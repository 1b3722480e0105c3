"""Private: group."""
