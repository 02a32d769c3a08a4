"""A SuperLink process for test_fleet_idle_polls: Flower's app on an SQLite file, with
fedveil's Fleet listener (gateway, idle polls from memory, Flower's Fleet routes) served
by uvicorn on a loopback port, as the SuperLink child of `fedveil server` builds it
(link_socket.superlink_main, without TLS).

The test drives it over stdin/stdout, one JSON object a line:
  {"op": "register", "pem": "..."}           -> {"node": id}  (Flower's Control API call)
  {"op": "push", "node": id, "ttl": seconds} -> {"ids": [...]} (a ServerApp's push: the
      message and its objects stored in this process's LinkState as Flower's Runtime API
      handler stores them, the write path the index listens to)
  {"op": "idle"}                             -> {"idle": count} (answered from memory)
  {"op": "node", "node": id}                 -> {"status": s, "online_until": t} (Flower's
      get_node_info, the read behind node listings and the ServerApp's node ids)
  {"op": "delete", "node": id}               -> {} (Flower's Control API deletion)
  {"op": "pending"}                          -> {"pending": n} (heartbeats not yet written)
  {"op": "key_hits"}                         -> {"hits": n} (key lookups answered from memory)
It prints {"port": p} once the Fleet port serves. A second argument, seconds, turns on
heartbeats written in batches at that interval (heartbeats.py) and the key map
(node_keys.py), as superlink_main does.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import sys
import threading
from pathlib import Path


def main(state_dir: Path, flush_s: float | None) -> None:
    os.environ["FLWR_DATABASE"] = str(state_dir / "superlink.db")
    from flwr.app import Message, RecordDict
    from flwr.common.constant import NOOP_ACCOUNT_NAME, NOOP_FLWR_AID, SUPERLINK_NODE_ID
    from flwr.supercore.constant import NOOP_FEDERATION_ID, TaskType
    from flwr.supercore.inflatable.inflatable_object import (
        get_all_nested_objects,
        get_object_tree,
        no_object_id_recompute,
    )
    from flwr.supercore.task_identity import TaskIdentity
    from flwr.superlink.main import create_app

    from fedveil.server.coordinator.fleet_counters import FleetCounterFile
    from fedveil.server.coordinator.fleet_listener import FleetListenerSpec, fleet_server
    from fedveil.server.coordinator.heartbeats import batched_heartbeats
    from fedveil.server.coordinator.idle_polls import watched_index
    from fedveil.server.coordinator.node_keys import watched_keys

    app = create_app()
    app.state.enable_supernode_auth = True
    index = watched_index(app)  # before any write, as superlink_main does
    heartbeats = None if flush_s is None else batched_heartbeats(app, flush_s)
    keys = None if heartbeats is None else watched_keys(app)
    state = app.state.linkstate_factory.state()
    run_id = state.create_run(
        None, None, None, {}, NOOP_FEDERATION_ID, None, NOOP_FLWR_AID, TaskType.SERVER_APP
    )
    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = (
        run_id,
        SUPERLINK_NODE_ID,
        1,
    )

    def push(node: int, ttl: float) -> list[str]:
        """What Flower's Runtime push-messages and push-object handlers do with a message."""
        msg = Message(RecordDict(), node, "train", ttl=ttl)
        with no_object_id_recompute():
            msg.metadata.__dict__["_message_id"] = msg.object_id
            session = state.start_session(run_id)
            stored, missing = state.store_message_and_object_tree(
                msg, get_object_tree(msg), session
            )
            objects = get_all_nested_objects(msg)
            for object_id in missing:
                state.store_object(run_id, session, object_id, objects[object_id].deflate())
        return [msg.metadata.message_id] if stored else []

    counters_path = state_dir / "fleet-counters.bin"
    counters = FleetCounterFile(counters_path, create=True)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    sock.listen(64)
    spec = FleetListenerSpec(
        fd=sock.fileno(),
        certfile=None,
        keyfile=None,
        max_body_bytes=1 << 20,
        max_per_listener=64,
        max_per_peer=64,
        request_timeout_s=30.0,
        counters_path=str(counters_path),
    )
    server, fleet_sock = fleet_server(app, spec, index, heartbeats, keys)

    def control() -> None:
        print(json.dumps({"port": sock.getsockname()[1]}), flush=True)
        for line in sys.stdin:
            cmd = json.loads(line)
            if cmd["op"] == "register":
                node = state.create_node(
                    NOOP_FLWR_AID, NOOP_ACCOUNT_NAME, cmd["pem"].encode(), 30.0
                )
                out: dict[str, object] = {"node": node}
            elif cmd["op"] == "push":
                out = {"ids": push(int(cmd["node"]), float(cmd["ttl"]))}
            elif cmd["op"] == "node":
                (info,) = state.get_node_info(node_ids=[int(cmd["node"])])
                out = {"status": info.status, "online_until": info.online_until}
            elif cmd["op"] == "delete":
                state.delete_node(NOOP_FLWR_AID, int(cmd["node"]))
                out = {}
            elif cmd["op"] == "key_hits":
                out = {"hits": -1 if keys is None else keys.hits}
            elif cmd["op"] == "pending":
                out = {"pending": -1 if heartbeats is None else heartbeats.pending()}
            else:
                out = {"idle": counters.idle_count()}
            print(json.dumps(out), flush=True)
        server.should_exit = True

    threading.Thread(target=control, daemon=True).start()
    asyncio.run(server.serve(sockets=[fleet_sock]))


if __name__ == "__main__":
    main(Path(sys.argv[1]), float(sys.argv[2]) if len(sys.argv) > 2 else None)
