"""Reading an engine's Prometheus ``/metrics`` page (text exposition format 0.0.4) with
prometheus-client's own parser (``prometheus_client.parser.text_string_to_metric_families``), the
reference implementation of the format: https://prometheus.io/docs/instrumenting/exposition_formats/
(read 2026-12-01)."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

__all__ = ["parse_prometheus_text", "series_key"]


def _escape(value: str) -> str:
    """A label value escaped as the text format writes it (backslash, double quote, line feed)."""
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def series_key(name: str, labels: dict[str, str]) -> str:
    """The key of one series: the sample name, plus its labels sorted by name in ``{a="x",b="y"}`` form
    (values escaped as in the text format) when it has any: ``vllm:num_requests_running{model_name="m"}``."""
    if not labels:
        return name
    return name + "{" + ",".join(f'{k}="{_escape(v)}"' for k, v in sorted(labels.items())) + "}"


def parse_prometheus_text(text: str) -> dict[str, float]:
    """Parse a Prometheus text exposition into ``{series key: value}`` (see :func:`series_key`).

    Sample names are kept as written (a counter's ``_total``, a histogram's ``_bucket``/``_sum``/``_count``);
    timestamps are dropped; ``NaN``, ``+Inf`` and ``-Inf`` become floats. Raises :class:`ValueError`
    (one line, prometheus-client's reason) when the text is not valid exposition format: a page that
    does not parse is reported, not half read.
    """
    out: dict[str, float] = {}
    try:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                out[series_key(sample.name, dict(sample.labels))] = float(sample.value)
    except (ValueError, TypeError, IndexError, KeyError) as e:
        reason = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise ValueError(f"not Prometheus text exposition format: {reason}") from None
    return out
