"""Enrolled clients: which SuperNode key is which fedveil client id.

With SuperNode authentication on, a device can only connect with a key the
coordinator registered with the SuperLink. Enrolling records the client id
the key belongs to, so the ServerApp refuses a node that claims another
client's id; revoking unregisters the key, after which the SuperLink refuses
the device. The registry (clients.json) is written by the service only.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

from fedveil.ops.certs import CertError, fingerprint, load_client_public_key, public_key_pem
from fedveil.server.coordinator.rundir import read_json, write_json

MAX_CLIENT_ID = 1_000_000


class EnrollError(ValueError):
    def __init__(self, status: int, field: str, message: str) -> None:
        super().__init__(message)
        self.status, self.field = status, field


class ClientRegistry:
    def __init__(self, state_dir: Path) -> None:
        self.path = Path(state_dir) / "clients.json"
        self._lock = threading.Lock()

    def all(self) -> dict[int, dict[str, Any]]:
        raw = read_json(self.path, {}) or {}
        return {int(k): v for k, v in raw.get("clients", {}).items()}

    def node_map(self) -> dict[int, int]:
        """node id -> client id, for keys that are enrolled and not revoked."""
        return {int(r["node_id"]): cid for cid, r in self.all().items() if not r.get("revoked_at")}

    def connected(self, online_nodes: set[int]) -> int:
        """Online nodes that map to an enrolled, unrevoked client id: the connected clients.

        A node the SuperLink lists but the registry does not map (refused, revoked, or
        registered some other way) is not a client and is not counted."""
        return len(online_nodes & self.node_map().keys())

    def _save(self, clients: dict[int, dict[str, Any]]) -> None:
        write_json(self.path, {"clients": {str(k): v for k, v in sorted(clients.items())}})

    def enroll(self, link: Any, client_id: Any, public_key: Any, name: Any) -> dict[str, Any]:
        if isinstance(client_id, bool) or not isinstance(client_id, int):
            raise EnrollError(422, "client_id", f"client_id = {client_id!r}: must be an integer")
        if not 0 <= client_id < MAX_CLIENT_ID:
            raise EnrollError(
                422, "client_id", f"client_id = {client_id}: must be in [0, {MAX_CLIENT_ID})"
            )
        if not isinstance(public_key, str) or len(public_key) > 4096:
            raise EnrollError(422, "public_key", "public_key: must be an OpenSSH public key line")
        if name is None:
            name = f"client-{client_id}"
        if not isinstance(name, str) or not 0 < len(name) <= 100 or any(ord(c) < 32 for c in name):
            raise EnrollError(422, "name", "name: must be a string of 1 to 100 characters")
        try:
            key = load_client_public_key(public_key)
        except CertError as exc:
            raise EnrollError(422, "public_key", str(exc)) from None
        fp = fingerprint(key)
        with self._lock:
            clients = self.all()
            current = clients.get(client_id)
            if current and not current.get("revoked_at"):
                raise EnrollError(409, "client_id", f"client {client_id} is already enrolled")
            for cid, r in clients.items():
                if r.get("fingerprint") == fp and not r.get("revoked_at"):
                    raise EnrollError(
                        409, "public_key", f"this key is already enrolled as client {cid}"
                    )
            try:
                node_id = link.register_node(public_key_pem(key), name)
            except Exception as exc:
                raise EnrollError(
                    409, "public_key", f"the SuperLink refused the key: {exc}"
                ) from None
            record = {
                "client_id": client_id,
                "name": name,
                "fingerprint": fp,
                "node_id": node_id,
                "public_key": public_key.strip(),
                "enrolled_at": time.time(),
                "revoked_at": None,
            }
            if current:
                record["previous"] = [*current.pop("previous", []), current]
            clients[client_id] = record
            self._save(clients)
        return record

    def revoke(self, link: Any, client_id: int) -> dict[str, Any]:
        with self._lock:
            clients = self.all()
            record = clients.get(client_id)
            if record is None:
                raise EnrollError(404, "client_id", f"client {client_id} is not enrolled")
            if record.get("revoked_at"):
                return record
            link.unregister_node(int(record["node_id"]))
            record["revoked_at"] = time.time()
            self._save(clients)
        return record
