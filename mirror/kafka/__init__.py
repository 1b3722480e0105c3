"""Private: kafka."""
