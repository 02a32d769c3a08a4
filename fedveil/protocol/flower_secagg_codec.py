"""fedveil's secure-aggregation stages inside a Flower Message-API app's messages.

Flower dispatches a message by its type before any mod runs, so the stages travel as
the strategy's own `train` (or `evaluate`) messages carrying fedveil's records beside
the strategy's, as Flower's `secaggplus_mod` does: the server side
(fedveil.server.engine.flower_secagg) puts them there, the client mod
(fedveil.client.flower_secagg_mod) takes them out. The masked-input stage also carries
the strategy's own records (its model and config), for the app's @app.train() /
@app.evaluate() function.
"""

from __future__ import annotations

from flwr.app import RecordDict

from fedveil.protocol.envelope import Envelope
from fedveil.protocol.flower_codec import from_content, to_content

PREFIX = "fedveil.secagg."  # record names: the Envelope's meta, config and arrays

# Masked-input request fields (Envelope config) of this path, beside the encoding's.
PURPOSE = "flower.purpose"  # TRAIN: an update and metrics; EVALUATE: metrics only
TRAIN, EVALUATE = "train", "evaluate"
WEIGHT_KEY = "flower.weight_key"  # the reply metric weighting the client ("": weight 1)
METRICS = "flower.metrics"  # the reply metrics averaged inside the protocol, in order
METRIC_RANGE = "flower.metric_range"  # metrics are scaled from [-range, range] into the clip


def is_protocol(content: RecordDict) -> bool:
    """Whether a message carries a fedveil secure-aggregation stage."""
    return PREFIX + "meta" in content


def pack(env: Envelope, content: RecordDict | None = None) -> RecordDict:
    """`content` (a new RecordDict if None) with the stage's Envelope added."""
    out = RecordDict() if content is None else content
    for name, record in to_content(env).items():
        out[PREFIX + name] = record
    return out


def unpack(content: RecordDict) -> Envelope:
    """The stage's Envelope (MessageError when malformed)."""
    own = RecordDict(
        {name[len(PREFIX) :]: rec for name, rec in content.items() if name.startswith(PREFIX)}
    )
    return from_content(own)


def app_part(content: RecordDict) -> RecordDict:
    """The strategy's own records (what the app's function reads)."""
    return RecordDict({n: r for n, r in content.items() if not n.startswith(PREFIX)})
