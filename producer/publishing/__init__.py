"""Private: publishing."""
