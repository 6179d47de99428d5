"""servelab.bench."""
