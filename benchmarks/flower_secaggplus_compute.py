"""Flower 1.41's SecAgg+ compute, replayed stage by stage with Flower's own functions.

What `secaggplus_mod` (client) and `SecAggPlusWorkflow` (server) compute in one round, on
the inputs of `bench_secagg` (its updates, dropped clients, k and t), with no transport:
P-384 key pairs as PEM, Fernet, pycryptodome Shamir over 16-byte chunks, NumPy MT masks.
Each client's work per stage and the server's per stage are timed in CPU seconds
(`bench_secagg.CLOCK`), like our protocol's. `bench_secagg.bench_flower_secaggplus_compute`
runs it; this module imports Flower, so it is only imported when the peer is asked for.
"""

from __future__ import annotations

import os
import random
import time
from collections import defaultdict
from collections.abc import Callable
from typing import Any

import numpy as np
from flwr.common import bytes_to_ndarray, ndarray_to_bytes
from flwr.common.secure_aggregation.crypto.shamir import combine_shares, create_shares
from flwr.common.secure_aggregation.crypto.symmetric_encryption import (
    decrypt,
    encrypt,
    generate_shared_key,
)
from flwr.common.secure_aggregation.ndarrays_arithmetic import (
    factor_combine,
    factor_extract,
    get_parameters_shape,
    parameters_addition,
    parameters_mod,
    parameters_multiply,
    parameters_subtraction,
)
from flwr.common.secure_aggregation.quantization import dequantize, quantize
from flwr.common.secure_aggregation.secaggplus_utils import (
    pseudo_rand_gen,
    share_keys_plaintext_concat,
    share_keys_plaintext_separate,
)
from flwr.supercore.primitives.asymmetric import (
    bytes_to_private_key,
    bytes_to_public_key,
    generate_key_pairs,
    private_key_to_bytes,
    public_key_to_bytes,
)

from fedveil.benchmarks.secagg_workload import (
    CLIP_RANGE,
    CLOCK,
    FLOWER_MOD_RANGE,
    LEVELS,
    MAX_WEIGHT,
    _expected_mean,
    _median,
    client_update,
    dropped_clients,
    graph_parameters,
)

# A client's two key pairs, PEM: (sk1, pk1, sk2, pk2).
Keys = tuple[bytes, bytes, bytes, bytes]
Arrays = list[np.ndarray]


class FlowerRound:
    """One SecAgg+ round's state, client and server side; one method per stage."""

    def __init__(
        self,
        n: int,
        dim: int,
        dropout: float,
        neighbors: int | None,
        threshold: int | None,
        seed: int,
    ) -> None:
        self.n, self.dim, self.dropout, self.seed = n, dim, dropout, seed
        self.ids = list(range(1, n + 1))
        k, self.t = graph_parameters(n, dropout, neighbors, threshold)
        self.num_shares = min(k + 1, n)  # neighbours + itself, as in the workflow
        self.dropped = dropped_clients(self.ids, dropout, seed)
        self.active = [c for c in self.ids if c not in self.dropped]
        self.client_time: dict[str, dict[int, float]] = defaultdict(lambda: defaultdict(float))
        self.server_time: dict[str, float] = defaultdict(float)
        self.neighbours: dict[int, set[int]] = {}
        self.keys: dict[int, Keys] = {}
        self.seeds: dict[int, bytes] = {}
        self.ss2: dict[int, dict[int, bytes]] = defaultdict(dict)
        self.own_shares: dict[int, tuple[bytes, bytes]] = {}
        self.inbox: dict[int, list[tuple[int, bytes]]] = defaultdict(list)
        self.held: dict[int, dict[int, tuple[bytes, bytes]]] = defaultdict(dict)
        self.uploads: dict[int, list[bytes]] = {}
        self.collected: dict[int, list[bytes]] = {}
        self.total: Arrays | None = None
        self.aggregated: np.ndarray | None = None

    def timed(self, stage: str, cid: int, fn: Callable[[], Any]) -> Any:
        """`fn()`, its CPU time added to client `cid`'s at `stage`."""
        t0 = CLOCK()
        out = fn()
        self.client_time[stage][cid] += CLOCK() - t0
        return out

    def run(self) -> None:
        self.setup_graph()
        self.setup_keys()
        self.share_keys()
        self.masked_inputs()
        self.sum_inputs()
        self.unmask()
        self.finalize()

    # -- server setup and stage 0 ---------------------------------------------------------
    def setup_graph(self) -> None:
        """Server setup: shuffled ring, each node with num_shares//2 on each side plus itself."""
        t0 = CLOCK()
        order = list(self.ids)
        random.Random(self.seed).shuffle(order)
        half, n = self.num_shares >> 1, self.n
        self.neighbours = {
            nid: {order[(i + off) % n] for off in range(-half, half + 1)}
            for i, nid in enumerate(order)
        }
        self.server_time["setup"] += CLOCK() - t0

    def setup_keys(self) -> None:
        """Stage 0 (setup): two P-384 key pairs per client, PEM-serialised."""
        for cid in self.ids:
            self.keys[cid] = self.timed("setup", cid, _key_pairs)

    # -- stage 1 ----------------------------------------------------------------------------
    def share_keys(self) -> None:
        """Stage 1 (share keys): Shamir-share seed and sk1, encrypt per neighbour with Fernet;
        the server routes the ciphertexts."""
        outbox: dict[int, list[tuple[int, bytes]]] = {}
        for cid in self.ids:
            public = {nid: (self.keys[nid][1], self.keys[nid][3]) for nid in self.neighbours[cid]}
            outbox[cid] = self.timed(
                "share_keys", cid, lambda cid=cid, public=public: self._shares_of(cid, public)
            )
        t0 = CLOCK()
        for src, messages in outbox.items():
            for dst, ciphertext in messages:
                self.inbox[dst].append((src, ciphertext))
        self.server_time["share_keys"] += CLOCK() - t0

    def _shares_of(self, cid: int, public: dict[int, tuple[bytes, bytes]]) -> list:
        pk_list = [pk for pair in public.values() for pk in pair]
        assert len(set(pk_list)) == len(pk_list)
        seed_bytes = os.urandom(32)
        self.seeds[cid] = seed_bytes
        b_shares = create_shares(seed_bytes, self.t, self.num_shares)
        sk1_shares = create_shares(self.keys[cid][0], self.t, self.num_shares)
        out = []
        for idx, (nid, (_, pk2)) in enumerate(public.items()):
            if nid == cid:
                self.own_shares[cid] = (b_shares[idx], sk1_shares[idx])
                continue
            shared = generate_shared_key(
                bytes_to_private_key(self.keys[cid][2]), bytes_to_public_key(pk2)
            )
            self.ss2[cid][nid] = shared
            plaintext = share_keys_plaintext_concat(cid, nid, b_shares[idx], sk1_shares[idx])
            out.append((nid, encrypt(shared, plaintext)))
        return out

    # -- stage 2 ----------------------------------------------------------------------------
    def masked_inputs(self) -> None:
        """Stage 2 (collect masked vectors): decrypt shares, quantize, mask with NumPy MT PRGs.
        Quantization is reported as its own stage, like the caller-side one on our side."""
        quantize_time = self.client_time["quantize"]
        for cid in self.active:
            x, weight = client_update(cid, self.dim, self.seed)
            self.uploads[cid] = self.timed(
                "masked_input",
                cid,
                lambda cid=cid, x=x, weight=weight: self._masked(cid, x, weight),
            )
            self.client_time["masked_input"][cid] -= quantize_time[cid]

    def _masked(self, cid: int, x: np.ndarray, weight: int) -> list[bytes]:
        for src, ciphertext in self.inbox[cid]:
            plaintext = decrypt(self.ss2[cid][src], ciphertext)
            actual_src, dst, b_share, sk1_share = share_keys_plaintext_separate(plaintext)
            assert actual_src == src and dst == cid
            self.held[cid][src] = (b_share, sk1_share)
        self.held[cid][cid] = self.own_shares[cid]
        t_quantize = CLOCK()
        q_ratio = round(weight / MAX_WEIGHT * LEVELS)
        params = parameters_multiply([x], q_ratio / LEVELS)
        quantized = factor_combine(q_ratio, quantize(params, CLIP_RANGE, LEVELS))
        self.client_time["quantize"][cid] += CLOCK() - t_quantize
        shapes = [a.shape for a in quantized]
        quantized = parameters_addition(
            quantized, pseudo_rand_gen(self.seeds[cid], FLOWER_MOD_RANGE, shapes)
        )
        for nid, _ in self.inbox[cid]:
            shared = generate_shared_key(
                bytes_to_private_key(self.keys[cid][0]), bytes_to_public_key(self.keys[nid][1])
            )
            mask = pseudo_rand_gen(shared, FLOWER_MOD_RANGE, shapes)
            combine = parameters_addition if cid > nid else parameters_subtraction
            quantized = combine(quantized, mask)
        quantized = parameters_mod(quantized, FLOWER_MOD_RANGE)
        return [ndarray_to_bytes(a) for a in quantized]

    def sum_inputs(self) -> None:
        """The server's sum of the masked vectors."""
        t0 = CLOCK()
        total = None
        for cid in self.active:
            vector = [bytes_to_ndarray(b) for b in self.uploads[cid]]
            total = vector if total is None else parameters_addition(total, vector)
        assert total is not None
        self.total = parameters_mod(total, FLOWER_MOD_RANGE)
        self.server_time["masked_input"] += CLOCK() - t0

    # -- stage 3 and the server's finish ------------------------------------------------------
    def unmask(self) -> None:
        """Stage 3 (unmask): survivors send b-shares of active and sk1-shares of dead
        neighbours; the server files them by owner."""
        self.collected = {nid: [] for nid in self.ids}
        for cid in self.active:
            owners, shares = self.timed("unmask", cid, lambda cid=cid: self._unmask_shares(cid))
            t0 = CLOCK()
            for owner, share in zip(owners, shares, strict=True):
                self.collected[owner].append(share)
            self.server_time["unmask"] += CLOCK() - t0

    def _unmask_shares(self, cid: int) -> tuple[list[int], list[bytes]]:
        near = self.neighbours[cid]
        alive = [nid for nid in near if nid not in self.dropped]
        dead = [nid for nid in near if nid in self.dropped]
        held = self.held[cid]
        return alive + dead, [held[nid][0] for nid in alive] + [held[nid][1] for nid in dead]

    def finalize(self) -> None:
        """The server rebuilds each seed or sk1, strips the masks and dequantizes."""
        t0 = CLOCK()
        total = self.total
        assert total is not None
        shapes = get_parameters_shape(total)
        for nid, share_list in self.collected.items():
            if len(share_list) < self.t:
                raise RuntimeError("Flower round would fail: not enough shares")
            secret = combine_shares(share_list)
            if nid not in self.dropped:
                total = parameters_subtraction(
                    total, pseudo_rand_gen(secret, FLOWER_MOD_RANGE, shapes)
                )
                continue
            for other in self.neighbours[nid] - {nid}:
                shared = generate_shared_key(
                    bytes_to_private_key(secret), bytes_to_public_key(self.keys[other][1])
                )
                mask = pseudo_rand_gen(shared, FLOWER_MOD_RANGE, shapes)
                combine = parameters_addition if nid > other else parameters_subtraction
                total = combine(total, mask)
        total = parameters_mod(total, FLOWER_MOD_RANGE)
        q_total, body = factor_extract(total)
        aggregated = dequantize(body, CLIP_RANGE, LEVELS)[0]
        self.aggregated = (aggregated - (len(self.active) - 1) * CLIP_RANGE) * (LEVELS / q_total)
        self.server_time["finalize"] += CLOCK() - t0

    # -- the figures --------------------------------------------------------------------------
    def result(self, started: float) -> dict[str, Any]:
        """The figures; `started`: the round's perf_counter start, for its wall time."""
        per_client_total: dict[int, float] = defaultdict(float)
        for times in self.client_time.values():
            for cid, seconds in times.items():
                per_client_total[cid] += seconds
        clients, server = sum(per_client_total.values()), sum(self.server_time.values())
        expected = _expected_mean(set(self.active), self.dim, self.seed)
        return {
            "protocol": "flower-secagg+",
            "n": self.n,
            "dim": self.dim,
            "dropout": self.dropout,
            "neighbors": self.num_shares - 1,
            "threshold": self.t,
            "survivors": len(self.active),
            "client_stage_median_s": {s: _median(v.values()) for s, v in self.client_time.items()},
            "client_total_median_s": _median(per_client_total.values()),
            "server_stage_s": dict(self.server_time),
            "server_total_s": server,
            "total_compute_s": clients + server,
            "total_compute_excl_quantize_s": clients
            + server
            - sum(self.client_time["quantize"].values()),
            "mean_close": bool(np.allclose(self.aggregated, expected, atol=1e-2)),
            "wall_s": time.perf_counter() - started,
        }


def _key_pairs() -> Keys:
    sk1, pk1 = generate_key_pairs()
    sk2, pk2 = generate_key_pairs()
    return (
        private_key_to_bytes(sk1),
        public_key_to_bytes(pk1),
        private_key_to_bytes(sk2),
        public_key_to_bytes(pk2),
    )


def flower_round_compute(
    n: int,
    dim: int,
    dropout: float,
    neighbors: int | None = None,
    threshold: int | None = None,
    seed: int = 0,
) -> dict[str, Any]:
    """One SecAgg+ round on `bench_secagg`'s inputs; its per-stage CPU seconds."""
    started = time.perf_counter()
    flower_round = FlowerRound(n, dim, dropout, neighbors, threshold, seed)
    flower_round.run()
    return flower_round.result(started)
