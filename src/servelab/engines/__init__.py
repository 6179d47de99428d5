"""servelab.engines."""
