"""disk."""
