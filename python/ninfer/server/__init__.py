"""HTTP serving: the ASGI app, SSE framing, errors, and the `ninfer-serve` console script."""
