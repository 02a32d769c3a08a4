"""Which loopback port the device's SuperNode serves its Runtime API on, learnt from the
SuperNode itself.

Flower's SuperNode takes its Runtime API port on the command line (1-65535; no port 0),
so the worker picks a free one and the SuperNode binds it a moment later: another
process can take the port in between. The contract that closes that race:
- the SuperNode child (supernode.py, `--runtime-port-file PATH`) writes the port its
  Runtime API server is bound to into PATH once that server is listening, read from the
  server's own socket; if the server cannot listen, the child exits with
  EXIT_RUNTIME_UNBOUND before writing anything;
- the worker (edge.py, with fedveil.ops.procs.await_reported_port) talks to the port
  the file names and nothing else, so a process that took the picked port is never
  mistaken for its SuperNode; after EXIT_RUNTIME_UNBOUND it starts the SuperNode again
  on a fresh port, at most PORT_TRIES times, then gives up with RuntimePortUnavailable
  (naming the ports tried).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from fedveil.ops.procs import report_port

FLAG = "--runtime-port-file"
EXIT_RUNTIME_UNBOUND = 98  # EADDRINUSE's number on Linux: the usual cause
PORT_TRIES = 5


class RuntimePortUnavailable(ValueError):
    """The SuperNode's Runtime API could not listen on any port tried. A ValueError, so
    that `fedveil client` reports it as a setup error (fedveil.cli.main)."""

    def __init__(self, ports: Sequence[int], log: Path) -> None:
        tried = ", ".join(str(p) for p in ports)
        super().__init__(
            f"the SuperNode's Runtime API could not listen on 127.0.0.1 port {tried} "
            f"({len(ports)} tries; in use by another process?); see {log}"
        )
        self.ports = list(ports)


# -- the SuperNode's side (in the child) ------------------------------------------------
def take_flag(argv: list[str]) -> Path | None:
    """Remove `--runtime-port-file PATH` from `argv` (Flower's parser does not know it)."""
    if FLAG not in argv:
        return None
    i = argv.index(FLAG)
    if i + 1 >= len(argv):
        raise SystemExit(f"{FLAG} needs a path")
    path = Path(argv[i + 1])
    del argv[i : i + 2]
    return path


def reporting(start: Callable[..., tuple[Any, Any]], path: Path) -> Callable[..., tuple[Any, Any]]:
    """Flower's `_start_supernode_http_api`, reporting the bound port to `path`, or
    exiting with EXIT_RUNTIME_UNBOUND when the server does not start listening."""

    def start_and_report(config: Any, *args: Any, **kwargs: Any) -> tuple[Any, Any]:
        try:
            server, thread = start(config, *args, **kwargs)
        except RuntimeError as exc:  # uvicorn logged why (typically: address in use)
            print(
                f"fedveil: the Runtime API could not listen on {config.host}:{config.port}: {exc}",
                file=sys.stderr,
                flush=True,
            )
            raise SystemExit(EXIT_RUNTIME_UNBOUND) from exc
        report_port(path, int(server.servers[0].sockets[0].getsockname()[1]))
        return server, thread

    return start_and_report
