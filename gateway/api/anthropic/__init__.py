"""anthropic."""
