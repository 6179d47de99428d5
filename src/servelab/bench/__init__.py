"""servelab.bench: load tests against any OpenAI-compatible server.

- :mod:`servelab.bench.load`: load generation (the runner, load steps, workers, Ray);
- :mod:`servelab.bench.workloads`: the workload registry and each workload source;
- :mod:`servelab.bench.analysis`: metrics, intervals, the steady window, SLOs, rebuilding a summary;
- the package's interface at this level: :mod:`~servelab.bench.results` (the typed ``summary.json``),
  :mod:`~servelab.bench.events` (observer events), :mod:`~servelab.bench.options` (option checks),
  :mod:`~servelab.bench.cli` and :mod:`~servelab.bench.bars` (the command and its progress bars).
"""
