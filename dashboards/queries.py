"""PromQL expressions built from the metric specs: the dashboards and rules share them.

No metric, label or stage name is spelled here; everything comes from
``tokenpath.metric_names`` and ``tokenpath.stages``. Each builder takes the range window
(``$__rate_interval`` in dashboards, ``5m`` in rules), the label matchers to apply and the
labels to aggregate by.
"""

from __future__ import annotations

from collections.abc import Sequence

from tokenpath import metric_names as mn

# Grafana template-variable names and the matchers that use them.
VAR_DATASOURCE = "datasource"
VAR_MODEL = "model"
VAR_POOL = "pool"
RATE_INTERVAL = "$__rate_interval"
MODEL_MATCHER = f'{mn.LABEL_MODEL}=~"${VAR_MODEL}"'
POOL_MATCHER = f'{mn.LABEL_POOL}=~"${VAR_POOL}"'

SECONDS_PER_HOUR = 3600
TOKENS_PER_MILLION = 1_000_000


def eq(label: str, value: str) -> str:
    """An equality matcher ``label="value"``."""
    return f'{label}="{value}"'


def selector(series: str, matchers: Sequence[str] = ()) -> str:
    """``series{m1,m2}`` (no braces without matchers)."""
    return f"{series}{{{','.join(matchers)}}}" if matchers else series


def by_clause(by: Sequence[str]) -> str:
    return f" by ({', '.join(by)})" if by else ""


def rate(series: str, window: str, matchers: Sequence[str] = (), shift: str = "") -> str:
    """``rate(series{...}[window])``, optionally ``offset shift`` back in time."""
    shifted = f" offset {shift}" if shift else ""
    return f"rate({selector(series, matchers)}[{window}]{shifted})"


def sum_rate(series: str, window: str, matchers: Sequence[str] = (),
             by: Sequence[str] = (), shift: str = "") -> str:
    return f"sum{by_clause(by)} ({rate(series, window, matchers, shift)})"


def sum_increase(series: str, window: str, matchers: Sequence[str] = (),
                 by: Sequence[str] = ()) -> str:
    return f"sum{by_clause(by)} (increase({selector(series, matchers)}[{window}]))"


def token_rate(kind: str, window: str, matchers: Sequence[str] = (),
               by: Sequence[str] = (), shift: str = "") -> str:
    """Tokens per second of one kind (input, cache_read, output)."""
    return sum_rate(mn.TOKENS.series, window, (*matchers, eq(mn.LABEL_KIND, kind)), by, shift)


def prefix_cache_hit_ratio(window: str, matchers: Sequence[str] = (),
                           by: Sequence[str] = (), shift: str = "") -> str:
    """Token-weighted prefix-cache hit ratio: cache_read tokens over input tokens."""
    return (f"{token_rate(mn.TOKEN_KIND_CACHE_READ, window, matchers, by, shift)}\n/\n"
            f"{token_rate(mn.TOKEN_KIND_INPUT, window, matchers, by, shift)}")


def histogram_quantile(quantile: float, spec: mn.MetricSpec, window: str,
                       matchers: Sequence[str] = (), by: Sequence[str] = ()) -> str:
    bucket = spec.series + mn.HISTOGRAM_BUCKET_SUFFIX
    return (f"histogram_quantile({quantile}, "
            f"{sum_rate(bucket, window, matchers, (*by, mn.LABEL_LE))})")


def histogram_share_above(spec: mn.MetricSpec, bound: str, window: str,
                          matchers: Sequence[str] = (), by: Sequence[str] = ()) -> str:
    """Share of observations above a bucket bound (the bound as exposed, e.g. ``1.0``)."""
    bucket = spec.series + mn.HISTOGRAM_BUCKET_SUFFIX
    below = sum_rate(bucket, window, (*matchers, eq(mn.LABEL_LE, bound)), by)
    total = sum_rate(spec.series + mn.HISTOGRAM_COUNT_SUFFIX, window, matchers, by)
    return f"1 - (\n{below}\n/\n{total}\n)"


def dollars_per_million_output_tokens(window: str, matchers: Sequence[str] = (),
                                      by: Sequence[str] = ()) -> str:
    cost = sum_rate(mn.COST.series, window, matchers, by)
    output = token_rate(mn.TOKEN_KIND_OUTPUT, window, matchers, by)
    return f"{TOKENS_PER_MILLION} * {cost}\n/\n{output}"


def dollars_per_hour(spec: mn.MetricSpec, window: str, matchers: Sequence[str] = (),
                     by: Sequence[str] = ()) -> str:
    return f"{SECONDS_PER_HOUR} * {sum_rate(spec.series, window, matchers, by)}"


def share_of_total(spec: mn.MetricSpec, label: str, window: str,
                   matchers: Sequence[str] = ()) -> str:
    """Each value of ``label`` as a share of the metric's total rate."""
    part = sum_rate(spec.series, window, matchers, (label,))
    total = sum_rate(spec.series, window, matchers)
    return f"{part}\n/ ignoring({label}) group_left\n{total}"


def share_matching(spec: mn.MetricSpec, matcher: str, window: str,
                   matchers: Sequence[str] = (), by: Sequence[str] = ()) -> str:
    """Share of the metric's rate whose series match ``matcher``."""
    part = sum_rate(spec.series, window, (*matchers, matcher), by)
    total = sum_rate(spec.series, window, matchers, by)
    return f"{part}\n/\n{total}"


def offset(expr: str, duration: str) -> str:
    """A recorded series (a bare name) shifted back in time."""
    return f"{expr} offset {duration}"


def slo_goodput(window: str, matchers: Sequence[str] = (), by: Sequence[str] = ()) -> str:
    """Requests per second within their SLO class's targets (outcome met)."""
    return sum_rate(mn.SLO_REQUESTS.series, window, (*matchers, eq(mn.LABEL_OUTCOME, "met")),
                    by)


def slo_dollars_per_good_request(window: str, matchers: Sequence[str] = (),
                                 by: Sequence[str] = ()) -> str:
    """Every dollar of the SLO classes' requests (met, missed, unknown) over the met ones."""
    on = f" on({', '.join(by)})" if by else ""
    return (f"{sum_rate(mn.SLO_DOLLARS.series, window, matchers, by)}\n/{on}\n"
            f"{slo_goodput(window, matchers, by)}")


def slo_attainment(window: str, matchers: Sequence[str] = (), by: Sequence[str] = ()) -> str:
    """met / (met + missed): the share the classes' objectives are held against."""
    judged = sum_rate(mn.SLO_REQUESTS.series, window,
                      (*matchers, f'{mn.LABEL_OUTCOME}=~"met|missed"'), by)
    on = f" on({', '.join(by)})" if by else ""
    return f"{slo_goodput(window, matchers, by)}\n/{on}\n{judged}"
