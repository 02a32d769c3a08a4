"""A secure-aggregation message inside an Envelope, both ways.

The protocol's messages (fedveil.privacy.secagg.messages) encode to a config dict
and an arrays dict; in an Envelope their fields sit under the `SA` prefix, beside
whatever else the request carries (the training request on the masked-input stage).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

import numpy as np

from fedveil.protocol.envelope import Envelope
from fedveil.protocol.fields import SA


class WireMessage(Protocol):
    def to_wire(self) -> tuple[Mapping[str, Any], Mapping[str, Any]]: ...


def protocol_part(msg: Envelope) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """The secure-aggregation message's own fields (prefix removed)."""
    config = {k[len(SA) :]: v for k, v in msg.config.items() if k.startswith(SA)}
    arrays = {k[len(SA) :]: _as_array(v) for k, v in msg.arrays.items() if k.startswith(SA)}
    return config, arrays


def _as_array(value: Any) -> Any:
    """A numpy array (from a torch tensor in process); a value numpy cannot take (a ragged
    list) stays as it is, for the protocol decoder to refuse by name."""
    try:
        return np.asarray(value)
    except (ValueError, TypeError):
        return value


def wrap(kind: str, round_num: int, message: WireMessage) -> Envelope:
    """An Envelope of `kind` for round `round_num` carrying `message`."""
    config, arrays = message.to_wire()
    return Envelope(
        kind,
        round_num,
        {SA + k: v for k, v in config.items()},
        {SA + k: v for k, v in arrays.items()},
    )
