"""responses."""
