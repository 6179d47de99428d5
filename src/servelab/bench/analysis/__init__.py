"""Analysis of finished requests: metric definitions, confidence intervals, the steady window, SLOs
and gates, and rebuilding a summary from ``requests.jsonl``."""
