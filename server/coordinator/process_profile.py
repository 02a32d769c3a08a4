"""cProfile of a whole process: its main thread and every thread started after.

Contract. `profiled(path)` enables cProfile on the calling thread and, through
`threading.setprofile`, on each thread started while it is open (the thread pools
FastAPI sends synchronous endpoints and dependencies to, where Flower's Fleet work runs);
on exit it writes the merged statistics to `path` (pstats format). Threads still running
at that moment are counted up to then. With `path` None it does nothing.

A SIGTERM while it is open ends the process through SystemExit, so the statistics are
written: uvicorn, once it has shut down on SIGTERM, raises the signal again to the handler
that was there before it (by default that kills the process with nothing written).

Used by the SuperLink child when `FleetListenerSpec.profile_path` is set (fleet_listener.py):
`fleet_cost --profile` profiles the process that serves the Fleet port, not only
`fedveil server`.
"""

from __future__ import annotations

import contextlib
import cProfile
import pstats
import signal
import sys
import threading
from collections.abc import Generator
from pathlib import Path
from typing import Any


@contextlib.contextmanager
def profiled(path: str | Path | None) -> Generator[None, None, None]:
    if path is None:
        yield
        return
    profiles: list[cProfile.Profile] = []
    lock = threading.Lock()

    def start_in_thread(*_: Any) -> None:
        # Called as the new thread's first profile event: hand the thread to cProfile.
        sys.setprofile(None)
        prof = cProfile.Profile()
        with lock:
            profiles.append(prof)
        prof.enable()

    def exit_on_sigterm(signum: int, _frame: Any) -> None:
        raise SystemExit(128 + signum)

    previous = signal.signal(signal.SIGTERM, exit_on_sigterm)
    main = cProfile.Profile()
    threading.setprofile(start_in_thread)
    main.enable()
    try:
        yield
    finally:
        main.disable()
        threading.setprofile(None)  # type: ignore[arg-type]
        signal.signal(signal.SIGTERM, previous)
        stats = pstats.Stats(main)
        with lock:
            for prof in profiles:
                with contextlib.suppress(TypeError):  # a thread that recorded nothing
                    stats.add(prof)
        stats.dump_stats(str(path))
