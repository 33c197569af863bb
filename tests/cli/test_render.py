"""How the CLI prints money: a cost that is not zero never reads as zero."""

from __future__ import annotations

from tokenpath.cli.render import _usd


def test_dollars_keep_three_significant_digits_below_a_cent() -> None:
    assert _usd(None) == "-"
    assert _usd(0.0) == "$0"
    assert _usd(2.26e-7) == "$2.26e-07"
    assert _usd(0.004567) == "$0.00457"
    assert _usd(0.0123) == "$0.0123"
    assert _usd(1234.5) == "$1,234.5000"
