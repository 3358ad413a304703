"""Hashes of files, tensors and configs, and the cache roots: the one place that says how each is computed.

Every cache key and fingerprint in the package is made here, so the same bytes always hash the same way:

- ``sha256_file``: a file's bytes (the model-folder manifest, checkpoints, gate tables, the tokenizer hash);
- ``sampled_sha256``: evenly spaced blocks of a large file (a training data file's fingerprint);
- ``files_fingerprint``: the named files of a folder together (a distillation teacher);
- ``tensors_sha256`` / ``update_with_tensor``: named tensors as float32 bytes (a pretrained trunk's identity, the
  layer-mix state-cache keys);
- ``json_sha256`` / ``json_bytes``: a config as canonical JSON (the state-cache folder names);
- ``cache_root``: ``$MTL_DECODER_CACHE/KIND``, else ``~/.cache/mtl-decoder/KIND``.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch

CACHE_ENV = "MTL_DECODER_CACHE"
BLOCK = 1 << 20


def cache_root(kind: str) -> Path:
    """The default folder of one kind of cache ('states', 'targets'): under $MTL_DECODER_CACHE, else ~/.cache."""
    return Path(os.environ.get(CACHE_ENV, Path.home() / ".cache" / "mtl-decoder")) / kind


def _feed(digest: Any, path: str | Path, limit: int | None = None) -> None:
    left = limit
    with open(path, "rb") as f:
        while left is None or left > 0:
            block = f.read(BLOCK if left is None else min(BLOCK, left))
            if not block:
                break
            digest.update(block)
            left = None if left is None else left - len(block)


def sha256_file(path: str | Path, limit: int | None = None) -> str:
    """The SHA-256 of a file's bytes (of its first ``limit`` bytes when given)."""
    digest = hashlib.sha256()
    _feed(digest, path, limit)
    return digest.hexdigest()


def sampled_sha256(path: str | Path, samples: int, sample_bytes: int) -> str:
    """The SHA-256 of ``samples`` evenly spaced blocks of ``sample_bytes`` of a large file, first and last included."""
    size = os.path.getsize(path)
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for i in range(samples):
            f.seek((size - sample_bytes) * i // (samples - 1))
            digest.update(f.read(sample_bytes))
    return digest.hexdigest()


def file_manifest(folder: str | Path, skip: Iterable[str] = ()) -> dict[str, dict[str, Any]]:
    """The size and SHA-256 of every file under a folder.

    Every file under ``folder`` (its path relative to it, '/'-separated, sorted) -> its size and SHA-256;
    the relative paths in ``skip`` left out."""
    folder, skipped = Path(folder), set(skip)
    return {
        p.relative_to(folder).as_posix(): {"bytes": p.stat().st_size, "sha256": sha256_file(p)}
        for p in sorted(folder.rglob("*"))
        if p.is_file() and p.relative_to(folder).as_posix() not in skipped
    }


def files_fingerprint(folder: str | Path, names: Iterable[str]) -> str:
    """A 16-byte BLAKE2b of the files ``names`` of ``folder`` that exist, each as its name then its bytes."""
    digest = hashlib.blake2b(digest_size=16)
    for name in names:
        path = Path(folder) / name
        if not path.is_file():
            continue
        digest.update(name.encode())
        _feed(digest, path)
    return digest.hexdigest()


def update_with_tensor(digest: Any, name: str, tensor: torch.Tensor) -> None:
    """Add one named tensor to a running hash: its name, then its values as contiguous float32 bytes."""
    digest.update(name.encode())
    digest.update(tensor.detach().to("cpu", torch.float32).contiguous().numpy().tobytes())


def tensors_sha256(tensors: Iterable[tuple[str, torch.Tensor]]) -> str:
    """The SHA-256 of named tensors in the given order (a module's weights: ``module.state_dict().items()``)."""
    digest = hashlib.sha256()
    for name, tensor in tensors:
        update_with_tensor(digest, name, tensor)
    return digest.hexdigest()


def json_bytes(data: Any) -> bytes:
    """``data`` as canonical JSON bytes (sorted keys; what JSON cannot hold written as its ``str``)."""
    return json.dumps(data, sort_keys=True, default=str).encode()


def json_sha256(data: Any) -> str:
    """The SHA-256 of ``data`` as canonical JSON (``json_bytes``)."""
    return hashlib.sha256(json_bytes(data)).hexdigest()


def short_digest(data: bytes) -> str:
    """A 16-byte BLAKE2b of ``data`` in hex: the key of one cached entry (a token sequence, a text)."""
    return hashlib.blake2b(data, digest_size=16).hexdigest()
