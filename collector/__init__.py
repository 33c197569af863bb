"""tokenpath."""
