"""Benchmarks run by ``make bench`` (SPEC section 7): each reports ratios measured in one run."""
