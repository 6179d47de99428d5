"""servelab.modelfile."""
