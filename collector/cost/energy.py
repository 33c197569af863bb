"""Energy per request, apportioned like dollars (modeled where no GPU energy is measured).

The attributor gives each record its share of its GPUs' time (the same slices and work
weights as its dollars; dollars = GPU-seconds x the GPU's $/s). Without a measured energy
counter the joules are modeled from that share and the GPU's board power (TDP, from the
datasheet in tokenpath/roofline.py):

- a request's joules = its apportioned GPU-seconds x TDP (a GPU serving inference runs
  close to its power limit: an upper bound, labelled ``modeled``);
- idle joules = the idle GPU-seconds x TDP x ``IDLE_POWER_FRACTION`` (0.15: an idle H100
  draws 70 to 100 W of its 700 W).

The agent pushes each GPU's measured energy (``tokenpath_gpu_energy_joules_total``, NVML's
total-energy counter); apportioning those measured joules over the same slices is not
built yet, so every joule shown today is labelled ``modeled``.
"""

from __future__ import annotations

from tokenpath.roofline import GPUS

ENERGY_MODELED = "modeled"
IDLE_POWER_FRACTION = 0.15


def tdp_watts(gpu_type: str | None) -> float | None:
    spec = GPUS.get(gpu_type or "")
    return spec.tdp_watts if spec is not None and spec.tdp_watts > 0 else None


def modeled_busy_joules(gpu_dollars: float, dollars_per_gpu_second: float,
                        gpu_type: str | None) -> float | None:
    """Joules of ``gpu_dollars`` of apportioned GPU time; None when the GPU's TDP or
    price is unknown."""
    watts = tdp_watts(gpu_type)
    if watts is None or dollars_per_gpu_second <= 0:
        return None
    return max(0.0, gpu_dollars) / dollars_per_gpu_second * watts


def modeled_idle_joules(idle_dollars: float, dollars_per_gpu_second: float,
                        gpu_type: str | None) -> float:
    watts = tdp_watts(gpu_type)
    if watts is None or dollars_per_gpu_second <= 0:
        return 0.0
    return max(0.0, idle_dollars) / dollars_per_gpu_second * watts * IDLE_POWER_FRACTION
