"""Shared fixtures: deterministic protocol randomness so statistical tests cannot flake."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator

import pytest
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

from fedveil.privacy.secagg import randomness


class _TestDrbg:
    """AES-CTR byte stream keyed by the test's name (test-only stand-in for os.urandom)."""

    def __init__(self, label: str) -> None:
        key = hashlib.sha256(b"fedveil-secagg-tests/" + label.encode()).digest()
        self._encryptor = Cipher(algorithms.AES(key), modes.CTR(bytes(16))).encryptor()

    def __call__(self, n: int) -> bytes:
        return self._encryptor.update(bytes(n))


@pytest.fixture(autouse=True)
def deterministic_randomness(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> Iterator[None]:
    """Every key, seed and nonce in a test comes from a reproducible stream.

    Tests marked `real_randomness` keep the OS CSPRNG.
    """
    if request.node.get_closest_marker("real_randomness") is None:
        monkeypatch.setattr(randomness, "random_bytes", _TestDrbg(request.node.nodeid))
    yield


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "real_randomness: use os.urandom, not the test DRBG")
