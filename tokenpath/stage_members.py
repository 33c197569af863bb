"""The members of the stage enums (tokenpath/stages.py) as module constants, for the
compiled core (mypyc) only.

On CPython 3.11 ``EnumType`` defines ``__getattr__``, so reading a member off its class
(``Phase.PREFILL``) goes through the interpreter's generic attribute hook: about 880
instructions a read in the compiled pricing (measured with callgrind), where a module
constant is one dictionary lookup. The objects are the same (``PREFILL is
Phase.PREFILL``); code that is not on the compiled per-request path uses the enums.
"""

from __future__ import annotations

from typing import Final

from tokenpath.stages import Phase, Provenance, StageGroup, StageId

CLIENT_TOKENIZE: Final = StageId.CLIENT_TOKENIZE
API_GATEWAY: Final = StageId.API_GATEWAY
AUTH_RATELIMIT: Final = StageId.AUTH_RATELIMIT
ROUTER: Final = StageId.ROUTER
SCHEDULER_QUEUE: Final = StageId.SCHEDULER_QUEUE
KV_CACHE_LOOKUP: Final = StageId.KV_CACHE_LOOKUP
GPU_DISPATCH: Final = StageId.GPU_DISPATCH
HBM_LOAD: Final = StageId.HBM_LOAD
KERNEL_EXEC: Final = StageId.KERNEL_EXEC
NVLINK: Final = StageId.NVLINK
SWITCH_HOP: Final = StageId.SWITCH_HOP
NIC_TX: Final = StageId.NIC_TX
ETHERNET_SERIALIZE: Final = StageId.ETHERNET_SERIALIZE
RESPONSE_PATH: Final = StageId.RESPONSE_PATH
CLIENT_DECODE: Final = StageId.CLIENT_DECODE
PREFILL: Final = Phase.PREFILL
DECODE: Final = Phase.DECODE
KV_TRANSFER: Final = Phase.KV_TRANSFER
MEASURED: Final = Provenance.MEASURED
DERIVED: Final = Provenance.DERIVED
MODELED: Final = Provenance.MODELED
GROUP_CLIENT: Final = StageGroup.CLIENT
GROUP_GATEWAY: Final = StageGroup.GATEWAY
GROUP_ENGINE: Final = StageGroup.ENGINE
GROUP_GPU: Final = StageGroup.GPU
GROUP_NETWORK: Final = StageGroup.NETWORK
