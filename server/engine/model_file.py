"""The run's model file (model.safetensors) as bytes that hash the same every time.

Contract: `model_file_bytes(tensors, metadata)` is a safetensors file whose bytes are a
function of the tensors and the metadata alone. safetensors writes its JSON header from
hash maps, so the same model saved twice (in two processes) can differ in header order;
the ledger's closing record binds the file by its SHA-256 (`model_sha256`), so the
header is rewritten here with sorted keys (the data section is untouched: tensor offsets
are relative to it). `sha256_hex` is the digest the ledger records.
"""

from __future__ import annotations

import hashlib
import json
import struct
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the coordinator imports this module and starts without torch
    import torch

MODEL_FILE = "model.safetensors"  # the run directory's published model
_LENGTH = struct.Struct("<Q")  # safetensors: an 8-byte little-endian header length
_ALIGN = 8  # the header is padded with spaces to keep the data 8-byte aligned


def model_file_bytes(tensors: Mapping[str, torch.Tensor], metadata: Mapping[str, str]) -> bytes:
    """`tensors` and `metadata` as a safetensors file, its header in canonical order."""
    from safetensors.torch import save

    raw = save(dict(tensors), metadata=dict(metadata))
    (length,) = _LENGTH.unpack_from(raw)
    header = json.loads(raw[_LENGTH.size : _LENGTH.size + length])
    text = json.dumps(header, sort_keys=True, separators=(",", ":")).encode("utf-8")
    text += b" " * (-len(text) % _ALIGN)
    return _LENGTH.pack(len(text)) + text + raw[_LENGTH.size + length :]


def sha256_hex(data: bytes) -> str:
    """The hex SHA-256 the ledger's closing record states for a model file."""
    return hashlib.sha256(data).hexdigest()


def file_sha256(path: Path) -> str:
    """The hex SHA-256 of the file at `path` (read in chunks: models can be large)."""
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()
