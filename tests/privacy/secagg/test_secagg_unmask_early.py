"""The server strips masks off the sum while the unmask replies arrive.

A secret (a survivor's self-mask seed, a dropped client's mask key) is reconstructed from
its first t shares as soon as it has them, and its masks regenerated then, so finalize
(after the last reply, on the round's critical path) is left with nothing to regenerate
in an honest round. The sum stays exact, and a secret whose first t shares are wrong is
still error-corrected by finalize, which names the holder of the wrong share.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from secagg_helpers import make_session, plain_sum, random_inputs

from fedveil.privacy.secagg import DropoutPattern, SecAggServer, Stage, run_in_memory, shamir
from fedveil.privacy.secagg import server as server_module
from fedveil.privacy.secagg.messages import Message, UnmaskShares


class MaskCount:
    """Counts the server's mask regenerations (the real ones), before and in finalize."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.before_finalize = self.in_finalize = 0
        self._in_finalize = False
        crypto = server_module.crypto
        self_mask_key, pairwise_mask_key = crypto.self_mask_key, crypto.pairwise_mask_key
        finalize = SecAggServer.finalize

        def count(fn):  # type: ignore[no-untyped-def]
            def counted(*args, **kwargs):  # type: ignore[no-untyped-def]
                if self._in_finalize:
                    self.in_finalize += 1
                else:
                    self.before_finalize += 1
                return fn(*args, **kwargs)

            return counted

        def finalize_counted(server: SecAggServer):  # type: ignore[no-untyped-def]
            self._in_finalize = True
            try:
                return finalize(server)
            finally:
                self._in_finalize = False

        monkeypatch.setattr(crypto, "self_mask_key", count(self_mask_key))
        monkeypatch.setattr(crypto, "pairwise_mask_key", count(pairwise_mask_key))
        monkeypatch.setattr(SecAggServer, "finalize", finalize_counted)


def _exact(session, inputs, report) -> bool:  # type: ignore[no-untyped-def]
    expected = plain_sum(inputs, report.result.survivors, session.modulus_bits)
    return report.result.total.astype(np.uint64).tolist() == expected.tolist()


def test_an_honest_round_regenerates_every_mask_before_finalize(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    session = make_session(12, neighbors=6, threshold=4, dimension=64)
    inputs = random_inputs(session, 3)
    dropped = list(session.client_ids[:2])
    server = SecAggServer(session)
    masks = MaskCount(monkeypatch)
    report = run_in_memory(
        session, inputs, dropouts=DropoutPattern.of(masked_input=dropped), server=server
    )
    assert _exact(session, inputs, report)
    assert report.result.bad_share_holders == frozenset()
    # 10 self masks, and the pairwise masks of the 2 dropped clients with their survivors
    assert masks.before_finalize >= 10 + 2
    assert masks.in_finalize == 0


def test_a_wrong_share_among_the_first_t_is_left_to_finalize_and_named(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    session = make_session(9, threshold=4, dimension=32)
    inputs = random_inputs(session, 7)
    liar = session.client_ids[0]  # in memory it replies first: its shares are in every first t

    def corrupt(message: UnmaskShares) -> UnmaskShares:
        bad = tuple(
            shamir.encode_share((shamir.decode_share(s) + 1) % shamir.PRIME)  # type: ignore[operator]
            for s in message.seed_shares
        )
        return dataclasses.replace(message, seed_shares=bad)

    def tamper(stage: Stage, cid: int, message: Message) -> list[Message]:
        wrong = stage is Stage.UNMASK and cid == liar
        return [corrupt(message) if wrong else message]  # type: ignore[arg-type]

    masks = MaskCount(monkeypatch)
    report = run_in_memory(
        session,
        inputs,
        dropouts=DropoutPattern.of(masked_input=[session.client_ids[8]]),
        tamper_up=tamper,
    )
    assert _exact(session, inputs, report)
    assert report.result.bad_share_holders == frozenset({liar})
    assert masks.in_finalize > 0  # the seeds whose first t shares included a wrong one
