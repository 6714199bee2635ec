"""rtml.cli."""
