"""Roofline model of transformer inference: the GPU and model catalog and the work formulas.

One source of truth shared by the simulated engine (which times its steps with it),
the cost attributor (which apportions measured GPU time with it) and the what-if engine.
Formulas and sources are written out in ``docs/cost-model.md``.

Work of one sequence in one engine step:

- prefill of ``n`` new tokens after ``c`` tokens already in the KV cache:
  ``flops = 2 * P * n + 4 * L * d_attn * (n * c + n * (n + 1) / 2)``
  (the second term is attention: QK^T and AV over every (query, key) pair, O(n^2));
- decode of one token at context ``c``:
  ``flops = 2 * P + 4 * L * d_attn * c``, ``bytes = kv_bytes_per_token * c``;
- every step also streams the weights once, ``P * bytes_per_param``, shared by the batch.

Step time is ``max(flops / F_eff, bytes / B_eff) + launch overhead``.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class GpuSpec:
    """Peak figures of one GPU (dense BF16, no sparsity)."""

    name: str
    peak_flops: float  # FLOP/s, dense BF16
    hbm_bandwidth: float  # bytes/s
    hbm_bytes: float
    nvlink_bandwidth: float  # bytes/s, per GPU, bidirectional aggregate
    source: str
    tdp_watts: float = 0.0  # board power limit (datasheet): the modeled energy's busy draw


@dataclass(frozen=True, slots=True)
class ModelSpec:
    """Dimensions of a decoder-only transformer."""

    name: str
    params: float
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    bytes_per_param: float = 2.0  # BF16 weights
    kv_bytes_per_element: float = 2.0  # BF16 KV cache
    source: str = ""

    @property
    def attention_dim(self) -> int:
        return self.heads * self.head_dim

    @property
    def weight_bytes(self) -> float:
        return self.params * self.bytes_per_param

    @property
    def kv_bytes_per_token(self) -> float:
        """K and V for every layer of one token."""
        return 2.0 * self.layers * self.kv_heads * self.head_dim * self.kv_bytes_per_element


GPUS: dict[str, GpuSpec] = {
    "H100-SXM": GpuSpec(
        "H100-SXM", 989e12, 3.35e12, 80e9, 900e9,
        "NVIDIA H100 Tensor Core GPU datasheet: 989 TFLOPS BF16 dense, 3.35 TB/s HBM3, "
        "80 GB, NVLink 900 GB/s, 700 W TDP",
        tdp_watts=700.0,
    ),
    "H200": GpuSpec(
        "H200", 989e12, 4.8e12, 141e9, 900e9,
        "NVIDIA H200 Tensor Core GPU datasheet: 989 TFLOPS BF16 dense, 4.8 TB/s HBM3e, "
        "141 GB, NVLink 900 GB/s, 700 W TDP",
        tdp_watts=700.0,
    ),
    "A100-SXM-80GB": GpuSpec(
        "A100-SXM-80GB", 312e12, 2.039e12, 80e9, 600e9,
        "NVIDIA A100 datasheet: 312 TFLOPS BF16 dense, 2,039 GB/s HBM2e, 80 GB, "
        "NVLink 600 GB/s, 400 W TDP",
        tdp_watts=400.0,
    ),
    "L4": GpuSpec(
        "L4", 121e12, 300e9, 24e9, 0.0,
        "NVIDIA L4 datasheet: 121 TFLOPS BF16 dense (242 with sparsity), 300 GB/s GDDR6, "
        "24 GB, no NVLink, 72 W TDP",
        tdp_watts=72.0,
    ),
}

MODELS: dict[str, ModelSpec] = {
    "llama-3.1-8b": ModelSpec(
        "llama-3.1-8b", 8.03e9, 32, 4096, 32, 8, 128,
        source="Meta Llama 3.1 8B config.json: 32 layers, hidden 4096, 32 heads, 8 KV heads",
    ),
    "llama-3.1-70b": ModelSpec(
        "llama-3.1-70b", 70.6e9, 80, 8192, 64, 8, 128,
        source="Meta Llama 3.1 70B config.json: 80 layers, hidden 8192, 64 heads, 8 KV heads",
    ),
}

# Achievable fractions of peak (model FLOPs utilization, memory bandwidth utilization).
DEFAULT_MFU = 0.55
DEFAULT_MBU = 0.80
DEFAULT_STEP_OVERHEAD_SECONDS = 0.0015  # host-side scheduling + kernel launch per step


@dataclass(frozen=True, slots=True)
class Roofline:
    """A GPU running a model, with achievable fractions of peak and tensor parallelism."""

    gpu: GpuSpec
    model: ModelSpec
    tensor_parallel: int = 1
    mfu: float = DEFAULT_MFU
    mbu: float = DEFAULT_MBU
    step_overhead_seconds: float = DEFAULT_STEP_OVERHEAD_SECONDS

    @property
    def effective_flops(self) -> float:
        return self.gpu.peak_flops * self.mfu * self.tensor_parallel

    @property
    def effective_bandwidth(self) -> float:
        return self.gpu.hbm_bandwidth * self.mbu * self.tensor_parallel

    def prefill_flops(self, new_tokens: int, cached_tokens: int) -> float:
        n, c = float(new_tokens), float(cached_tokens)
        linear = 2.0 * self.model.params * n
        attention = 4.0 * self.model.layers * self.model.attention_dim * (n * c + n * (n + 1) / 2)
        return linear + attention

    def prefill_attention_flops(self, new_tokens: int, cached_tokens: int) -> float:
        """The quadratic attention term alone (the long-context leak)."""
        n, c = float(new_tokens), float(cached_tokens)
        return 4.0 * self.model.layers * self.model.attention_dim * (n * c + n * (n + 1) / 2)

    def prefill_bytes(self, new_tokens: int, cached_tokens: int) -> float:
        """KV bytes a prefill reads (cached prefix) and writes (new tokens)."""
        return self.model.kv_bytes_per_token * float(cached_tokens + new_tokens)

    def decode_flops(self, context_tokens: float) -> float:
        """FLOPs of one decode token at ``context_tokens`` (a mean context may be fractional)."""
        return 2.0 * self.model.params + 4.0 * self.model.layers * self.model.attention_dim * float(
            context_tokens
        )

    def decode_bytes(self, context_tokens: float) -> float:
        """The sequence's own KV-cache read for one decode token (weights excluded)."""
        return self.model.kv_bytes_per_token * float(context_tokens)

    def compute_seconds(self, flops: float) -> float:
        return flops / self.effective_flops

    def memory_seconds(self, nbytes: float) -> float:
        return nbytes / self.effective_bandwidth

    def step_seconds(self, flops: float, seq_bytes: float, tokens: int = 0) -> float:
        """One engine step: weights streamed once plus the sequences' own bytes."""
        compute = self.compute_seconds(flops)
        memory = self.memory_seconds(self.model.weight_bytes + seq_bytes)
        return max(compute, memory) + self.step_overhead_seconds + self.nvlink_seconds(tokens)

    def sequence_work(self, flops: float, seq_bytes: float, batch_size: int) -> float:
        """A sequence's roofline work in a step, in seconds-equivalent.

        Compute time of its FLOPs plus memory time of its own bytes and its 1/batch share
        of the weights. Steps are apportioned among sequences by this weight.
        """
        weights_share = self.model.weight_bytes / max(1, batch_size)
        return self.compute_seconds(flops) + self.memory_seconds(seq_bytes + weights_share)

    def compute_fraction(self, flops: float, nbytes: float) -> float:
        """Share of in-model time that is compute-bound (kernel_exec) vs memory (hbm_load)."""
        compute = self.compute_seconds(flops)
        memory = self.memory_seconds(nbytes)
        total = compute + memory
        return compute / total if total > 0 else 0.0

    def nvlink_seconds(self, tokens: int) -> float:
        """Tensor-parallel all-reduce time for ``tokens`` tokens (two per layer)."""
        tp = self.tensor_parallel
        if tp <= 1 or self.gpu.nvlink_bandwidth <= 0 or tokens <= 0:
            return 0.0
        per_allreduce = 2.0 * (tp - 1) / tp * self.model.hidden * 2.0 * tokens
        total = per_allreduce * 2 * self.model.layers
        return total / self.gpu.nvlink_bandwidth


def roofline_for(gpu: str, model: str, tensor_parallel: int = 1) -> Roofline:
    """Look up catalog entries by name; raises KeyError naming what was not found."""
    if gpu not in GPUS:
        raise KeyError(f"unknown GPU {gpu!r}; known: {', '.join(sorted(GPUS))}")
    if model not in MODELS:
        raise KeyError(f"unknown model {model!r}; known: {', '.join(sorted(MODELS))}")
    return Roofline(GPUS[gpu], MODELS[model], tensor_parallel=tensor_parallel)
