"""Private: spark."""
