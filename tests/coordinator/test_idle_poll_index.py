"""Issue 33: the idle-poll index errs only towards "busy" (server/coordinator/idle_polls.py).

The statements are the ones Flower's SqlLinkState sends to SQLite (captured from flwr
1.42: its INSERT of a message, its claim, reads and deletes). What must hold: nothing
is quiet before the stored messages are read; an INSERT marks its node busy until
created_at + ttl; a NaN or missing TTL, an unreadable INSERT, or any other write to
message_ins makes the node, or every node, busy for good.
"""

from __future__ import annotations

import math

from fedveil.server.coordinator.idle_polls import PendingMessages, record_write

INSERT = (
    "INSERT INTO message_ins (message_id, group_id, run_id, src_node_id, dst_node_id, "
    "reply_to_message_id, created_at, delivered_at, ttl, message_type, content, error) "
    "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
)
CLAIM = (
    "WITH candidate_message_ins AS \n(SELECT message_ins.message_id AS message_id \n"
    "FROM message_ins \nWHERE message_ins.dst_node_id = ? AND message_ins.delivered_at = ?"
    " LIMIT ? OFFSET ?)\n UPDATE message_ins SET delivered_at=? WHERE message_ins.message_id"
    " IN (SELECT candidate_message_ins.message_id \nFROM candidate_message_ins) AND "
    "message_ins.delivered_at = ? RETURNING message_id"
)


def _row(node: int, created: float, ttl: float) -> tuple[object, ...]:
    return ("m", "", 1, 0, node, "", created, "", ttl, "train", b"", None)


def _primed() -> PendingMessages:
    index = PendingMessages()
    index.prime([])
    return index


def test_nothing_is_quiet_before_the_stored_messages_are_read() -> None:
    index = PendingMessages()
    assert not index.quiet(7, 1e9)
    index.prime([(7, 100.0)])
    assert not index.quiet(7, 99.0) and index.quiet(7, 100.0) and index.quiet(8, 0.0)


def test_an_insert_marks_its_node_busy_until_its_ttl_ends() -> None:
    index = _primed()
    record_write(index, INSERT, _row(-5, 1000.0, 30.0), False)
    assert not index.quiet(-5, 1029.9)
    assert index.quiet(-5, 1030.0)
    assert index.quiet(6, 1000.0)  # another node
    record_write(index, INSERT, [_row(9, 1000.0, 5.0), _row(9, 1000.0, 50.0)], True)
    assert not index.quiet(9, 1010.0)  # the latest expiry counts
    columns = INSERT.split("(")[1].split(")")[0].split(", ")
    named = dict(zip(columns, _row(11, 1000.0, 5.0), strict=True))  # by column name
    record_write(index, INSERT.replace("?", ":x"), named, False)
    assert not index.quiet(11, 1004.9)
    assert index.quiet(11, 1005.0)


def test_reads_deletes_and_flowers_claim_change_nothing() -> None:
    index = _primed()
    for statement in (
        "SELECT dst_node_id FROM message_ins",
        "DELETE FROM message_ins WHERE message_ins.message_id IN (?)",
        CLAIM,
        "INSERT INTO message_res (message_id) VALUES (?)",
    ):
        record_write(index, statement, ("x",), False)
    assert index.quiet(1, 0.0)


def test_unreadable_writes_fail_closed() -> None:
    index = _primed()
    record_write(index, INSERT, _row(3, 1000.0, math.nan), False)
    assert not index.quiet(3, 1e12)  # a NaN TTL: that node busy for good
    assert index.quiet(4, 0.0)
    record_write(index, INSERT, ("too", "few"), False)
    assert not index.quiet(4, 0.0)  # an INSERT not read: every node busy for good
    index.prime([])
    assert not index.quiet(4, 0.0)

    other = _primed()
    record_write(other, "UPDATE message_ins SET ttl=? WHERE message_id = ?", (1e9, "m"), False)
    assert not other.quiet(1, 0.0)
