"""``servelab trial``: the selection experiment — candidates, quality gate, load steps, evidence record,
decision and report. The experiment file format is :mod:`servelab.trial.spec` (docs/experiment.md)."""
