"""The built-in API's fixed parts: the stage table the UI draws, and the bounds of the
routes' query parameters (collector/http_app.py; the CLI's client pages by MAX_API_LIMIT).
The views the routes answer are tokenpath/views.py over the store.
"""

from __future__ import annotations

from typing import Any

from tokenpath.leaks import LONG_CONTEXT_TOKENS
from tokenpath.stages import GPU_STAGES, STAGES

# GET /api/requests: records per answer by default and at most; a client reads more in
# pages, each asking for records that ended at or before the last one it got (``until``).
DEFAULT_API_LIMIT = 100
MAX_API_LIMIT = 10_000
DEFAULT_TIMESERIES_BUCKETS = 30
MAX_TIMESERIES_BUCKETS = 500
DEFAULT_LEAK_LIMIT = 10
DEFAULT_LONG_CONTEXT_TOKENS = LONG_CONTEXT_TOKENS


def stages_view() -> list[dict[str, Any]]:
    """The 15-stage table in path order, as the UI draws it (never hard-coded in JS)."""
    return [
        {
            "id": stage.id.value,
            "order": stage.order,
            "title": stage.title,
            "emitted_by": stage.emitted_by,
            "bound_by": stage.bound_by,
            "group": stage.group.value,
            "gpu": stage.id in GPU_STAGES,
        }
        for stage in STAGES
    ]
