"""Capacity from evidence (issue 23; ../shared/seeds/003 §21): a traffic profile, its peak load, a
continuous-batching performance model fitted on a trial's or bench's own requests, a discrete-event
simulation of it, held-out validation, and the plan (replicas, burst headroom, devices, cost, what-if,
tiers). ``servelab capacity`` (:mod:`servelab.capacity.cli`) drives it."""
