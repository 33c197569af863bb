"""Fakes, each at the narrowest boundary the real code path reaches:

- ``fake_nvml``: the ``pynvml`` module (nvidia-ml-py) as the agent calls it, for machines
  without a GPU;
- ``fake_libnvml`` (``libnvml/``): a driver library under the real ``pynvml``, one
  boundary lower;
- ``engine_pages`` (``engine_pages/``): vLLM's and SGLang's /metrics pages;
- ``grafana_api``: the few Grafana HTTP API endpoints ``dashboards push`` calls;
- ``clickhouse_http``: ClickHouse's HTTP interface over chDB, for the real
  clickhouse-connect client;
- ``otel_sink``, ``otlp_capture``, ``otlp_http``: receivers that keep what the real
  OpenTelemetry SDK and exporters send (in memory, OTLP/gRPC, OTLP/HTTP);
- ``spans``: collector ``SpanData`` built directly and an in-memory trace consumer;
- ``clock``: a clock the test moves by hand (``clock=``).
"""
