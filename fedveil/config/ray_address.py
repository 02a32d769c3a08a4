"""`simulation.ray_address`: which Ray cluster Flower's simulation engine joins.

"" means: the RAY_ADDRESS environment variable if set (as `ray.init` reads it), else a
fresh single-machine Ray instance. "local" always starts a fresh one; "auto" joins the
cluster `ray start` left on this machine; "host:port" names a head node's GCS (port 6379
by default with `ray start --head`); "ray://host:port" goes through Ray Client.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

ENV = "RAY_ADDRESS"
FORMS = "'', 'local', 'auto', 'host:port' or 'ray://host:port'"


@dataclass(frozen=True)
class RayAddress:
    """An address as configured, and where it came from (the config or RAY_ADDRESS)."""

    text: str  # as given: '', 'local', 'auto', 'host:port', 'ray://host:port'
    source: str  # "simulation.ray_address" or "RAY_ADDRESS"

    @property
    def joins(self) -> bool:
        """True when the run joins an existing cluster rather than starting its own."""
        return self.text not in ("", "local")

    def endpoint(self) -> tuple[str, int] | None:
        """(host, port) to reach, or None for 'auto'/'local'/''."""
        if not self.joins or self.text == "auto":
            return None
        return split_host_port(self.text)


def split_host_port(text: str) -> tuple[str, int]:
    """'host:port' or 'ray://host:port' -> (host, port); ValueError names the allowed forms."""
    rest = text[len("ray://") :] if text.startswith("ray://") else text
    host, sep, port = rest.rpartition(":")
    host = host.strip("[]")  # IPv6 literals: [::1]:6379
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"{text!r}: must be one of {FORMS}, with a port in 1..65535")
    return host, int(port)


def check_ray_address(text: str) -> None:
    """ValueError unless `text` is one of the accepted forms."""
    if text in ("", "local", "auto"):
        return
    split_host_port(text)


def resolve_ray_address(configured: str, environ: dict[str, str] | None = None) -> RayAddress:
    """The address in force: the config's, else RAY_ADDRESS, else '' (a fresh instance)."""
    env = os.environ if environ is None else environ
    if configured:
        return RayAddress(configured, "simulation.ray_address")
    from_env = env.get(ENV, "").strip()
    if from_env:
        check_ray_address(from_env)
        return RayAddress(from_env, ENV)
    return RayAddress("", "simulation.ray_address")
