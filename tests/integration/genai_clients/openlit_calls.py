"""Run by the OpenLIT venv (scripts/client_env.sh openlit), not by pytest: the openai 2.x
client under OpenLIT 1.45, straight to a vLLM server, exporting its spans to a tokenpath
collector over OTLP/HTTP.

Usage: openlit_calls.py BASE_URL COLLECTOR_URL MODEL N MARKER PRICING_JSON. Prints one JSON
line per call as openinference_calls.py does. OpenLIT captures message content by default
(the collector must drop it); PRICING_JSON is a local file, so OpenLIT fetches no price
list from the network."""

from __future__ import annotations

import sys

import openlit
from chat_calls import make_calls


def main() -> None:
    base_url, collector, model, n, marker, pricing = sys.argv[1:7]
    openlit.init(otlp_endpoint=collector, application_name="openlit-app",
                 environment="test", disable_metrics=True, disable_batch=True,
                 pricing_json=pricing)
    make_calls(base_url, model, int(n), marker, "how come ")


if __name__ == "__main__":
    main()
