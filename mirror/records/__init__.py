"""Private: records."""
