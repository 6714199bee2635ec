"""rtml.scheduler."""
