"""Cost attribution: dollars per request and stage, idle cost, cache-miss waste, what-if.

Pure components over :class:`tokenpath.records.RequestRecord`; no Prometheus here. The
formulas are written out in ``docs/cost-model.md``.
"""
