"""The record-list oracles: the views of tokenpath/views.py computed the plain way, from a
list of records in Python, every figure summed or sorted exactly. The tests check the views
(SQL aggregates over a store, percentiles from log-bucket histograms) against them on the
same records, and the store bench runs them as the baseline of the code before the column
layout. Nothing of the product calls them: the product computes every view once, on the
read interface (tokenpath/query.py RecordQueries), whichever the source.

- ``report``: :func:`~testkit.oracles.report.build_report` (views.report_view) and the
  exact :func:`~testkit.oracles.report.percentile`;
- ``chargeback``: :func:`~testkit.oracles.chargeback.chargeback` (views.chargeback_view);
- ``leaks``: :func:`~testkit.oracles.leaks.rank_leaks` (views.rank_leaks_view) and
  :func:`~testkit.oracles.leaks.leaks_view` (views.leaks_view, ``/api/leaks``);
- ``timeseries``: :func:`~testkit.oracles.timeseries.timeseries_view`
  (views.timeseries_view, ``/api/timeseries``).
"""
