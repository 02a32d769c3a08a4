"""A service's listening socket, bound before its server starts.

The coordinator (its API, Fleet and serving ports) and `fedveil serve` bind each port
here, once, and hand the socket to the server (uvicorn, or the Fleet listener's process,
which inherits it). So a port that is taken, or an address this host does not have, is a
ConfigError naming HOST:PORT before anything runs, and port 0 gives the port the OS
chose (read it back with `getsockname`). A host with a ':' is IPv6.
"""

from __future__ import annotations

import socket

from fedveil.config import ConfigError

BACKLOG = 512  # connections the kernel queues before the server accepts them


def listening_socket(host: str, port: int) -> socket.socket:
    """A TCP socket listening on (host, port), inheritable by a child process; a
    ConfigError naming the address when it cannot be bound."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    # A restarted service rebinds its port at once, past the old one's TIME_WAIT.
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise ConfigError(f"cannot listen on {host}:{port}: {exc.strerror}") from None
    sock.listen(BACKLOG)
    sock.set_inheritable(True)
    return sock
