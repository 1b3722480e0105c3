"""Private: discovery."""
