"""servelab: choose an LLM inference engine by honest measurement.

Parts (one package each): ``wire`` (shared HTTP/SSE client, OpenAI types, error normalisation),
``bench`` (load tests), ``engines`` (launchers and the mock engine), ``modelfile`` (GGUF metadata and
tokenizer), ``trial``, ``gateway``, ``catalog``, ``plan``.
"""

__version__ = "0.1.0"
