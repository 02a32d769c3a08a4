"""FedAvg arithmetic on hand-made updates, and the server optimizers against hand computation."""

from __future__ import annotations

from collections.abc import Mapping

import pytest
import torch

from fedveil.protocol.envelope import Envelope
from fedveil.server.engine.aggregation import NoUpdates, PlainChannel
from fedveil.server.engine.optimizers import make_optimizer
from fedveil.server.engine.transport import ClientFailure, ReplySink


class ScriptedClients:
    """Clients whose replies are given up front (the arithmetic under test is the server's)."""

    def __init__(self, replies: dict[int, Envelope | ClientFailure]) -> None:
        self.replies = replies

    def client_ids(self) -> list[int]:
        return sorted(self.replies)

    def exchange(
        self,
        requests: Mapping[int, Envelope],
        timeout_s: float | None,
        on_reply: ReplySink | None = None,
    ):
        return {cid: self.replies[cid] for cid in requests}

    def close(self) -> None:
        pass


def reply(delta: list[float], n: int, loss: float = 1.0, rnd: int = 1) -> Envelope:
    return Envelope("train", rnd, {"num_examples": n, "loss": loss}, {"delta": torch.tensor(delta)})


def test_weighted_average_is_exact():
    clients = ScriptedClients(
        {0: reply([1.0, 2.0], 1, 4.0), 1: reply([3.0, -2.0], 3, 0.0), 2: reply([0.5, 0.5], 4, 1.0)}
    )
    req = Envelope("train", 1)
    agg = PlainChannel().collect(clients, {0: req, 1: req, 2: req}, 2, None)
    assert agg is not None
    assert agg.weight == 8
    expected = torch.tensor([(1 * 1 + 3 * 3 + 4 * 0.5) / 8, (1 * 2 - 3 * 2 + 4 * 0.5) / 8])
    assert torch.equal(agg.mean, expected)
    assert agg.loss == pytest.approx((4.0 * 1 + 0 + 1.0 * 4) / 8)
    assert agg.contributors == [0, 1, 2]


@pytest.mark.parametrize(
    ("bad", "reason"),
    [
        (reply([float("nan"), 1.0], 2), "NaN or Inf"),
        (reply([float("inf"), 1.0], 2), "NaN or Inf"),
        (reply([1.0, 1.0, 1.0], 2), "expected 2"),
        (reply([1.0, 1.0], 0), "num_examples = 0"),
        (reply([1.0, 1.0], 2, rnd=7), "for round 7"),
        (Envelope("train", 1, {"loss": 1.0}, {"delta": torch.ones(2)}), "num_examples"),
        (
            Envelope(
                "train", 1, {"num_examples": 2, "loss": 1.0}, {"delta": torch.ones(2).double()}
            ),
            "float32",
        ),
        (ClientFailure(1, "timed out"), "timed out"),
    ],
)
def test_bad_replies_drop_the_client_and_keep_the_rest(bad, reason):
    clients = ScriptedClients({0: reply([1.0, 1.0], 2), 1: bad, 2: reply([3.0, 3.0], 2)})
    req = Envelope("train", 1)
    agg = PlainChannel().collect(clients, {0: req, 1: req, 2: req}, 2, None)
    assert agg is not None
    assert agg.contributors == [0, 2]
    assert reason in agg.dropped[1]
    assert torch.equal(agg.mean, torch.tensor([2.0, 2.0]))


@pytest.mark.parametrize("robust", [False, True])
def test_finite_updates_that_would_overflow_the_sum_drop_their_client(robust):
    # Every value is finite, so the finiteness check passes; but 3e38 x 2 examples (and
    # two clients of 2e38) reach infinity in float32, and an infinite sum makes the model
    # NaN for the rest of the run. Each weighted value must stay under max / cohort.
    from fedveil.server.engine.robust import RobustAggregator

    big = float(torch.finfo(torch.float32).max) / 4
    clients = ScriptedClients(
        {
            0: reply([1.0, 1.0], 2),
            1: reply([3e38, 1.0], 2),
            2: reply([big, -big], 1),  # within max / 3: kept
            3: reply([3.0, 3.0], 2),
        }
    )
    req = Envelope("train", 1)
    requests = {0: req, 1: req, 2: req, 3: req}
    # trimmed_mean trimming nothing: the held updates' plain mean, a float32 sum too.
    aggregator = RobustAggregator("trimmed_mean") if robust else None
    agg = PlainChannel(aggregator=aggregator).collect(clients, requests, 2, None)
    assert agg.contributors == [0, 2, 3]
    assert "the sum would overflow" in agg.dropped[1]
    assert "largest |value| 3e+38 x weight 2" in agg.dropped[1]
    assert "over 8.507e+37 (float32's largest / 4 updates summed)" in agg.dropped[1]
    assert bool(torch.isfinite(agg.mean).all())


def test_no_usable_reply_gives_no_update_and_says_why():
    clients = ScriptedClients({0: ClientFailure(0, "gone")})
    got = PlainChannel().collect(clients, {0: Envelope("train", 1)}, 2, None)
    assert got == NoUpdates({0: "gone"})


def test_server_optimizers_match_hand_computation():
    w = torch.tensor([1.0, -1.0])
    d1, d2 = torch.tensor([0.5, 0.25]), torch.tensor([-0.5, 1.0])

    avg = make_optimizer("fedavg", lr=0.5)
    assert torch.equal(avg.step(w, d1), w + 0.5 * d1)

    m = make_optimizer("fedavgm", lr=1.0, momentum=0.9)
    w1 = m.step(w, d1)
    w2 = m.step(w1, d2)
    assert torch.allclose(w2, w1 + (0.9 * d1 + d2))

    for name in ("fedadam", "fedyogi"):
        opt = make_optimizer(name, lr=0.1, beta1=0.9, beta2=0.99, tau=1e-3)
        mom = 0.1 * d1
        v0 = torch.full_like(d1, 1e-6)
        if name == "fedadam":
            v = 0.99 * v0 + 0.01 * d1**2
        else:
            v = v0 - 0.01 * d1**2 * torch.sign(v0 - d1**2)
        assert torch.allclose(opt.step(w, d1), w + 0.1 * mom / (v.sqrt() + 1e-3))


def test_unknown_optimizer_is_named():
    with pytest.raises(ValueError, match=r"server\.optimizer = 'sgd'"):
        make_optimizer("sgd")


class HandsRepliesOver:
    """A transport that hands replies to `on_reply` in the order given (scrambled: as
    workers finish), keeping no reference itself, and returns `returned` in its dict,
    as a transport may for replies it did not hand over."""

    def __init__(self, order: list[int], replies: dict[int, Envelope], returned: set[int]):
        self.order, self.replies, self.returned = order, replies, returned
        self.alive_at_return: list[int] = []

    def client_ids(self) -> list[int]:
        return sorted(self.replies)

    def exchange(self, requests, timeout_s, on_reply=None):
        import weakref

        refs = {cid: weakref.ref(r.arrays["delta"]) for cid, r in self.replies.items()}
        out = {cid: self.replies.pop(cid) for cid in self.returned}
        for cid in self.order:
            reply = self.replies.pop(cid)
            if on_reply is None:
                out[cid] = reply
            else:
                on_reply(cid, reply)
            del reply
        # Who still holds an update handed over: the channel, unless it summed it already.
        self.alive_at_return = sorted(cid for cid in self.order if refs[cid]() is not None)
        return out

    def close(self) -> None:
        pass


def test_replies_are_summed_as_they_arrive_in_client_id_order_with_the_same_bits():
    gen = torch.Generator().manual_seed(7)
    deltas = {cid: torch.randn(1000, generator=gen) * 10 ** (cid % 5) for cid in range(12)}
    sizes = {cid: 1 + 3 * cid for cid in range(12)}

    def replies() -> dict[int, Envelope]:
        return {cid: reply(deltas[cid].tolist(), sizes[cid]) for cid in range(12)}

    req = Envelope("train", 1)
    requests = {cid: req for cid in range(12)}
    # Client 11 never replies; 5 and 9 come back in the exchange's dict, the rest are
    # handed over as two workers would finish them, out of id order.
    order = [3, 4, 0, 1, 2, 10, 6, 7, 8]
    scrambled = HandsRepliesOver(order, replies(), returned={5, 9})
    agg = PlainChannel().collect(scrambled, requests, 1000, None)
    in_order = PlainChannel().collect(
        ScriptedClients({**replies(), 11: ClientFailure(11, "no reply")}), requests, 1000, None
    )
    assert isinstance(agg, type(in_order))
    assert torch.equal(agg.mean, in_order.mean)  # the float sum's order is kept: same bits
    assert agg.weight == in_order.weight and agg.loss == in_order.loss
    assert agg.contributors == in_order.contributors == [c for c in range(12) if c != 11]
    assert agg.dropped == {11: "no reply"}
    # Every update handed over whose predecessors had all arrived was summed and let go
    # during the exchange (0..4 in order; 6..8 and 10 wait for 5 and 9, returned at the end).
    assert scrambled.alive_at_return == [6, 7, 8, 10]
