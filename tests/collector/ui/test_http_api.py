"""The UI's endpoints on a real collector listener: assets, JSON views, auth."""

from __future__ import annotations

import httpx
import pytest

from tests.collector.ui.conftest import start_collector, wait_for_records
from tests.collector.ui.workload import send_workload
from tokenpath.collector.http_app import UI_DIR
from tokenpath.collector.service import CollectorService
from tokenpath.stages import STAGE_IDS

pytestmark = pytest.mark.integration


def test_page_and_assets_are_served(collector: CollectorService) -> None:
    url = collector.http_url
    page = httpx.get(f"{url}/", timeout=5)
    assert page.status_code == 200
    assert page.text == (UI_DIR / "index.html").read_text(encoding="utf-8")
    for name, media in (("app.js", "text/javascript"), ("views.js", "text/javascript"),
                        ("slo.js", "text/javascript"),
                        ("charts.js", "text/javascript"), ("app.css", "text/css")):
        asset = httpx.get(f"{url}/ui/{name}", timeout=5)
        assert asset.status_code == 200, name
        assert asset.headers["content-type"].startswith(media)
        assert f"/ui/{name}" in page.text
    for bad in ("missing.js", "..%2Fhttp_app.py", ".hidden.js", "index.py"):
        assert httpx.get(f"{url}/ui/{bad}", timeout=5).status_code == 404, bad


def test_no_external_resources_in_the_ui() -> None:
    """Works offline: no CDN, no remote fonts or scripts."""
    for path in UI_DIR.iterdir():
        text = path.read_text(encoding="utf-8")
        assert "http://" not in text.replace("http://www.w3.org/2000/svg", ""), path.name
        assert "https://" not in text, path.name


def test_json_views_over_real_spans(collector: CollectorService) -> None:
    url = collector.http_url
    send_workload(url, 12, seed=4)
    wait_for_records(url, 12)
    stages = httpx.get(f"{url}/api/stages", timeout=5).json()
    assert [s["id"] for s in stages] == [s.value for s in STAGE_IDS]
    series = httpx.get(f"{url}/api/timeseries", params={"buckets": 4}, timeout=5).json()
    assert sum(p["requests"] for p in series["points"]) == 12
    leaks = httpx.get(f"{url}/api/leaks", params={"limit": 2}, timeout=5).json()
    assert leaks["requests"] == 12
    assert leaks["priced"] is True  # the cost attributor priced them
    assert len(leaks["cache"]["top_prefixes"]) <= 2
    assert set(leaks) == {"requests", "priced", "cache", "long_context",
                          "small_packets", "last_mile", "ranked", "window"}
    assert [leak["leak"] for leak in leaks["ranked"]] and len(leaks["ranked"]) == 3
    out = httpx.post(f"{url}/api/whatif", json={"spec_decode_speedup": 2.0}, timeout=5).json()
    for side in ("baseline", "projected"):
        assert {"cost_per_million_output_tokens", "requests_per_second_per_gpu",
                "ttft_p50_seconds"} <= set(out[side])
    bad = httpx.post(f"{url}/api/whatif", json={"quantization": "fp3"}, timeout=5)
    assert bad.status_code == 400
    assert "quantization" in bad.json()["detail"]
    # The page's opening projections: one read, the routing what-if and the defaults, over
    # a window the form and the CLI can name again (since counted back from until).
    page = httpx.get(f"{url}/api/whatif", params={"since": "1h"}, timeout=10).json()
    until = page["window"]["until_unix"]
    assert page["window"]["since_unix"] == pytest.approx(until - 3600)
    assert page["window"]["records"] == 12
    assert [s["id"] for s in page["scenarios"]] == ["prefix_affine", "cache", "spec_decode",
                                                    "int8"]
    assert all(s["provenance"] == "modeled" and s["calibrated_on"] for s in page["scenarios"])
    same = httpx.get(f"{url}/api/whatif", params={"since": "1h", "until": until},
                     timeout=10).json()
    assert same == page
    form = httpx.post(f"{url}/api/whatif", params={"since": "1h", "until": until},
                      json={"router": "prefix_affine"}, timeout=10).json()
    routing = page["scenarios"][0]
    assert form["routing"] == routing["routing"]
    assert form["projected"] == routing["projected"]
    assert form["window"] == page["window"]
    for until in ("nan", "inf", "soon"):
        answer = httpx.get(f"{url}/api/whatif", params={"until": until}, timeout=5)
        assert answer.status_code in (400, 422) and "until" in answer.text
    assert httpx.get(f"{url}/api/timeseries", params={"buckets": 0}, timeout=5).status_code == 422
    for since in ("nan", "inf", "-1h", "soon"):  # not a silent empty answer
        answer = httpx.get(f"{url}/api/requests", params={"since": since}, timeout=5)
        assert answer.status_code == 400 and "since" in answer.json()["detail"]


def test_auth_guards_data_but_not_the_shell() -> None:
    service = start_collector(auth_token="s3cret")
    try:
        url = service.http_url
        assert httpx.get(f"{url}/", timeout=5).status_code == 200
        assert httpx.get(f"{url}/ui/app.js", timeout=5).status_code == 200
        for path in ("/api/stages", "/api/summary", "/api/leaks", "/api/timeseries",
                     "/api/requests"):
            assert httpx.get(f"{url}{path}", timeout=5).status_code == 401, path
        assert httpx.post(f"{url}/api/whatif", json={}, timeout=5).status_code == 401
        assert httpx.get(f"{url}/api/whatif", timeout=5).status_code == 401
        ok = httpx.get(f"{url}/api/stages", headers={"Authorization": "Bearer s3cret"},
                       timeout=5)
        assert ok.status_code == 200
    finally:
        service.shutdown()
