"""Load generation: the bench runner, closed/open-loop load steps, multi-process and Ray workers, and
the request lines they write."""
