"""Builders and runners: ``otlp`` (export requests, /metrics reading), ``otlp_wire`` and
``otlp_strategies`` (mutations and Hypothesis strategies for fuzzing the decoders),
``certs`` (a throwaway CA and certificates), ``processes`` (tokenpath commands as
subprocesses on free loopback ports), ``loopback_http`` (the lifecycle of a test HTTP
server on loopback)."""
