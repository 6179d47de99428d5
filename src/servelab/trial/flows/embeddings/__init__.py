"""The embeddings flow (``goal.task_kind: embeddings``): the embeddings gate, load steps of
``/v1/embeddings`` requests, repeats, and a ranking on inputs/s at the SLO
(:class:`servelab.trial.flows.embeddings.flow.EmbeddingsFlow`)."""
