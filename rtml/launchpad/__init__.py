"""rtml.launchpad."""
