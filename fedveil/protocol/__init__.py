"""The protocol between server and clients, shared by both sides.

* `envelope`      – the one message shape every transport carries
* `kinds`         – message kinds, secure-aggregation stages, error codes
* `fields`        – field names of requests and replies
* `riders`        – pipelining: one exchange carrying a second protocol message
* `secagg_frame`  – a secure-aggregation message inside an Envelope
* `deployment`    – names shared by the coordinator's FAB and the device's ClientApp
* `flower_codec`  – Envelope <-> Flower records (imports flwr: not re-exported here)

Importing the package loads nothing heavy (no torch, no flwr): edge clients import the
DP layer, which names protocol fields, without the accounting or training stacks.
Import the Envelope from `fedveil.protocol.envelope`.
"""
