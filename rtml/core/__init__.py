"""rtml.core."""
