"""rtml.rpc."""
