"""What the tests and the benchmarks share, in one place, and nothing of the product.

- ``testkit.fakes``: stand-ins for what cannot run here, each at the narrowest boundary
  the real code path reaches (a driver library, an engine's pages, a server's HTTP
  interface), and in-memory receivers that keep what real exporters send.
- ``testkit.support``: builders of real inputs (OTLP export requests, certificates,
  fuzzing strategies) and helpers that run tokenpath's own commands as subprocesses.
- ``testkit.oracles``: the views of tokenpath/views.py computed the plain way, from a
  list of records in Python (the report, chargeback, the time series, the leaks): what
  the tests check the views against, and the store bench's baseline.

A helper only one test folder uses lives in that folder (``tests/<area>/...``); one that
two folders, or a test and a benchmark, use lives here. ``bench/`` imports from here,
never from ``tests/``. Not part of the installed package.
"""
