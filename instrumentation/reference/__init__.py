"""The reference serving path of docs/architecture.md: a simulated engine behind a real gateway.

Every part is a real component (auth, token bucket, router, continuous-batching
scheduler, paged KV cache with prefix caching); only the GPU is simulated: step times
come from the roofline model in :mod:`tokenpath.roofline`. It is labelled "simulated
engine" wherever it shows (span attribute ``tokenpath.simulated = true``,
``tokenpath.engine = "simulated"``).
"""

from __future__ import annotations

SIMULATED_ENGINE_NAME = "simulated"
SIMULATED_ENGINE_LABEL = "simulated engine"
