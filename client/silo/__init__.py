"""Cross-silo secure aggregation without a coordinator: a secure all-reduce.

N silos sum their updates among themselves on torch.distributed (gloo on CPU, NCCL on
GPU; rendezvous through torch.distributed's TCP store or torchrun's environment). Each
silo masks its quantised update with pairwise AES-CTR masks from X25519 keys agreed with
every other silo (adverts signed with its Ed25519 identity, checked against the operator's
roster), so the all-reduce returns the exact sum while every value a silo receives during
the collective is masked. What travels in the clear (gloo on CPU has no TLS): masked
values, the final sum (which every silo receives), and the store's membership keys.

Modules: `signed_wire` (the integer ring on the wire), `adverts` (signed keys, mask keys),
`masks`, `membership` (who is in an attempt; commit), `collectives` (all_reduce, a ring
over send/recv), `allreduce` (one round with aborts and reruns), `round` (encodings, DP,
accounting), `silo_ledger`, `rendezvous` (stores and identities), `training` (a silo's
local training between sums), `local` (N silos in threads: simulation and tests).
Imports: the core and privacy only.
"""

from .allreduce import SecureAllReduce, SecureSum, SiloRoundFailed, SiloSettings
from .round import RoundResult, SiloDp, SiloRound

__all__ = [
    "RoundResult",
    "SecureAllReduce",
    "SecureSum",
    "SiloDp",
    "SiloRound",
    "SiloRoundFailed",
    "SiloSettings",
]
