"""The protocol between server and clients, shared by both sides.

* `envelope`      – the one message shape every transport carries
* `kinds`         – message kinds, secure-aggregation stages, error codes
* `fields`        – field names of requests and replies
* `riders`        – pipelining: one exchange carrying a second protocol message
* `secagg_frame`  – a secure-aggregation message inside an Envelope
* `deployment`    – names shared by the coordinator's FAB and the device's ClientApp
* `flower_codec`  – Envelope <-> Flower records (imports flwr: not re-exported here)
"""

from .envelope import Envelope, MessageError
from .kinds import ErrorCode, Kind, Stage

__all__ = ["Envelope", "ErrorCode", "Kind", "MessageError", "Stage"]
