"""Issue 33: a key's node id from memory (server/coordinator/node_keys.py), on Flower's
real SqlLinkState (an SQLite file) in this process.

- the map answers a registered key's node id from memory, and forgets it when Flower
  deletes the node: a deleted node's key is no longer found;
- a lookup that read the database before a deletion committed does not put the old
  answer back (the generation check);
- an unknown key is never kept: registering it later is seen;
- fedveil's own heartbeat flush does not empty the map; Flower's writes to a node do.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from flwr.common.constant import NOOP_ACCOUNT_NAME, NOOP_FLWR_AID
from flwr.server.superlink.linkstate.sql_linkstate import SqlLinkState
from flwr.supercore.object_store import ObjectStoreFactory
from flwr.superlink.federation import NoOpFederationManager

from fedveil.server.coordinator.heartbeats import HeartbeatBatch
from fedveil.server.coordinator.node_keys import NodeKeys


def _state(path: Path, cls: type[SqlLinkState] = SqlLinkState) -> SqlLinkState:
    state = cls(
        str(path),
        federation_manager=NoOpFederationManager(),
        object_store=ObjectStoreFactory().store(),
    )
    state.initialize()
    return state


def _node(state: SqlLinkState) -> tuple[bytes, int]:
    key = os.urandom(65)  # the state stores the key's bytes; no curve check at this layer
    return key, state.create_node(NOOP_FLWR_AID, NOOP_ACCOUNT_NAME, key, 30.0)


@pytest.fixture
def state(tmp_path: Path) -> SqlLinkState:
    return _state(tmp_path / "link.db")


@pytest.fixture
def keys(state: SqlLinkState) -> Iterator[NodeKeys]:
    keys = NodeKeys(state)
    keys.watch()
    yield keys
    keys.unwatch()  # the listeners are process-wide


def test_a_deleted_nodes_key_is_forgotten(state: SqlLinkState, keys: NodeKeys) -> None:
    key, node = _node(state)
    assert keys.get_node_id_by_public_key(key) == node
    assert keys.get_node_id_by_public_key(key) == node
    assert keys.hits == 1  # the second answer came from memory
    state.delete_node(NOOP_FLWR_AID, node)
    assert keys.get_node_id_by_public_key(key) is None
    assert state.get_node_id_by_public_key(key) is None  # as Flower answers


def test_a_lookup_racing_a_deletion_does_not_keep_the_old_answer(tmp_path: Path) -> None:
    class DeletedMidLookup(SqlLinkState):
        """Flower's state; the first lookup of `victim` reads, then the node is deleted
        (committed) before the lookup returns: the interleaving of two threads."""

        victim: bytes = b""

        def get_node_id_by_public_key(self, public_key: bytes) -> int | None:
            node = super().get_node_id_by_public_key(public_key)
            if public_key == self.victim and node is not None:
                type(self).victim = b""
                self.delete_node(NOOP_FLWR_AID, node)
            return node

    state = _state(tmp_path / "race.db", DeletedMidLookup)
    keys = NodeKeys(state)
    keys.watch()
    try:
        key, node = _node(state)
        DeletedMidLookup.victim = key
        assert keys.get_node_id_by_public_key(key) == node  # read before the deletion
        assert keys.get_node_id_by_public_key(key) is None  # not kept: asked again
        assert keys.hits == 0
    finally:
        keys.unwatch()


def test_unknown_keys_are_not_kept(state: SqlLinkState, keys: NodeKeys) -> None:
    key = os.urandom(65)
    assert keys.get_node_id_by_public_key(key) is None
    node = state.create_node(NOOP_FLWR_AID, NOOP_ACCOUNT_NAME, key, 30.0)
    assert keys.get_node_id_by_public_key(key) == node


def test_the_heartbeat_flush_keeps_the_map_and_flowers_node_writes_empty_it(
    state: SqlLinkState, keys: NodeKeys
) -> None:
    batch = HeartbeatBatch(state, 3600.0)  # flushed by hand below
    own = NodeKeys(state)
    own.watch()
    try:
        key, node = _node(state)
        assert own.get_node_id_by_public_key(key) == node
        assert state.activate_node(node, 30.0)  # Flower's write to the node: forgotten
        assert own.get_node_id_by_public_key(key) == node
        assert own.hits == 0
        assert own.get_node_id_by_public_key(key) == node
        assert own.hits == 1
        batch.note(node, 30.0, time.time())
        assert batch.flush() == 1  # fedveil's own heartbeat write: kept
        assert own.get_node_id_by_public_key(key) == node
        assert own.hits == 2
    finally:
        own.unwatch()
