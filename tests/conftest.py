"""Shared pytest fixtures. Shared fakes (in-memory span sink, fake NVML) live in tests/fakes."""
