from __future__ import annotations

from pathlib import Path

import pytest

from tokenpath.collector.cost.prices import load_price_sheet, price_sheet_from_mapping
from tokenpath.config import ConfigError
from tokenpath.roofline import GPUS


def test_default_sheet_prices_every_catalog_gpu() -> None:
    sheet = load_price_sheet()
    assert set(GPUS) <= set(sheet.gpus)
    assert all(price.dollars_per_hour > 0 for price in sheet.gpus.values())
    assert sheet.cpu_dollars_per_core_hour > 0
    assert sheet.network_dollars_per_gb > 0


def test_default_sheet_cites_a_source_for_every_gpu_price() -> None:
    text = (Path(__file__).parents[3] / "tokenpath" / "data" / "prices.yaml").read_text()
    sections = text.split("dollars_per_hour:")[:-1]
    assert len(sections) == len(load_price_sheet().gpus)
    for section in sections:
        comment = section.rsplit(":\n", 1)[-1]
        assert "pricing" in comment and "2025" in comment


def test_non_positive_gpu_price_names_the_key() -> None:
    with pytest.raises(ConfigError) as info:
        price_sheet_from_mapping({"gpus": {"H100-SXM": {"dollars_per_hour": 0}}})
    assert str(info.value) == "gpus.H100-SXM.dollars_per_hour: must be > 0"


@pytest.mark.parametrize(
    ("data", "key"),
    [
        ({"gpus": {"H100-SXM": {"dollars_per_hour": "cheap"}}}, "gpus.H100-SXM.dollars_per_hour"),
        ({"gpus": {"H100-SXM": {}}}, "gpus.H100-SXM.dollars_per_hour"),
        ({"gpus": {"H100-SXM": {"dollars_per_hour": 2}}, "cpu": {"dollars_per_core_hour": -1}},
         "cpu.dollars_per_core_hour"),
        ({"gpus": {"H100-SXM": {"dollars_per_hour": 2}},
          "nodes": {"n1": {"gpu_type": "B200", "gpu_count": 8}}}, "nodes.n1.gpu_type"),
        ({"gpus": {"H100-SXM": {"dollars_per_hour": 2}},
          "nodes": {"n1": {"gpu_count": 0}}}, "nodes.n1.gpu_count"),
        ({"gpus": {"L4": {"dollars_per_hour": 1}}}, "default_gpu_type"),
        ({"gpus": {}}, "gpus"),
        # Not finite: an infinite price makes every idle slice inf - inf = NaN dollars.
        ({"gpus": {"H100-SXM": {"dollars_per_hour": float("inf")}}},
         "gpus.H100-SXM.dollars_per_hour"),
        ({"gpus": {"H100-SXM": {"dollars_per_hour": 2}},
          "network": {"dollars_per_gb": float("nan")}}, "network.dollars_per_gb"),
        ({"gpus": {"H100-SXM": {"dollars_per_hour": True}}}, "gpus.H100-SXM.dollars_per_hour"),
    ],
)
def test_invalid_values_name_their_key(data: dict[str, object], key: str) -> None:
    with pytest.raises(ConfigError) as info:
        price_sheet_from_mapping(data)
    assert info.value.key == key


def test_node_inventory_and_default_node(tmp_path: Path) -> None:
    path = tmp_path / "prices.yaml"
    path.write_text(
        "gpus: {H200: {dollars_per_hour: 4.0}}\n"
        "default_gpu_type: H200\n"
        "nodes: {gpu-1: {gpu_type: H200, gpu_count: 8, pool: prod}}\n"
        "default_node: {pool: spare}\n"
    )
    sheet = load_price_sheet(path)
    assert sheet.node_spec("gpu-1").gpu_count == 8
    assert sheet.node_spec("gpu-1").pool == "prod"
    assert sheet.node_spec("elsewhere").pool == "spare"
    assert sheet.gpu_price("unpriced").dollars_per_hour == 4.0


def test_unreadable_or_invalid_file_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        load_price_sheet(tmp_path / "missing.yaml")
    assert info.value.key == "prices"
    bad = tmp_path / "bad.yaml"
    bad.write_text("- a list\n")
    with pytest.raises(ConfigError):
        load_price_sheet(bad)
