"""Workloads: the one registry (:mod:`servelab.bench.workloads.registry`) and each workload source
(built-in sets, datasets, sessions, agent loops, traces, RAG, mixed language, embeddings)."""
