"""What `pip install fedveil[client]` brings onto a device, from the installed metadata."""

from __future__ import annotations

from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

pytestmark = pytest.mark.procs  # starts processes: not in make test-fast

SERVER_ONLY = {"ray", "dp-accounting", "scikit-learn", "matplotlib"}


def closure(name: str, extras: tuple[str, ...]) -> dict[str, metadata.Distribution]:
    """The installed distributions `name[extras]` needs, markers evaluated for this Python."""
    seen: dict[str, tuple[metadata.Distribution, set[str]]] = {}
    todo = [(name, set(extras))]
    while todo:
        dist_name, wanted = todo.pop()
        key = canonicalize_name(dist_name)
        if key in seen and wanted <= seen[key][1]:
            continue
        dist = metadata.distribution(dist_name)
        have = seen.get(key, (dist, set()))[1] | wanted
        seen[key] = (dist, have)
        for line in dist.requires or []:
            req = Requirement(line)
            if req.marker is None or any(req.marker.evaluate({"extra": e}) for e in (have or {""})):
                todo.append((req.name, set(req.extras)))
    return {k: d for k, (d, _) in seen.items()}


def installed_bytes(dist: metadata.Distribution) -> int:
    return sum(
        p.stat().st_size for f in dist.files or [] if (p := Path(dist.locate_file(f))).is_file()
    )


def test_the_client_extra_stays_lean():
    try:
        fedveil = metadata.distribution("fedveil")
    except metadata.PackageNotFoundError:
        pytest.skip("fedveil is not installed (no metadata to resolve)")
    direct = {
        canonicalize_name(Requirement(r).name)
        for r in fedveil.requires or []
        if Requirement(r).marker is None or Requirement(r).marker.evaluate({"extra": "client"})
    }
    # fedveil itself asks a device for no web server and no cluster framework ...
    assert not direct & {"fastapi", "uvicorn", "ray", *SERVER_ONLY}, direct
    try:
        dists = closure("fedveil", ("client",))
    except metadata.PackageNotFoundError as exc:
        pytest.skip(f"a dependency is not installed here: {exc}")
    # ... nor does anything it pulls in (flwr 1.41 brings FastAPI/uvicorn for its
    # SuperNode's loopback Runtime API: that is Flower's own requirement).
    assert not set(dists) & SERVER_ONLY, sorted(set(dists) & SERVER_ONLY)
    total = sum(installed_bytes(d) for k, d in dists.items() if k != "fedveil")
    print(f"\nfedveil[client]: {len(dists) - 1} distributions, {total / 1e6:.0f} MB installed")
