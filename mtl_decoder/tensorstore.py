"""A sharded tensor store: named tensors kept in a folder of safetensors shards, checked whenever a shard is read.

    FOLDER/shard-<time_ns>-<pid>.safetensors     each written whole and renamed into place, never modified

A tensor's name is ``KEY`` or ``KEY/PART``; the entry key (the name up to its first '/') is what the store
indexes, so an entry's tensors are written together and always found in one shard. Several runs and processes can
share a folder (``rescan`` finds the shards written since), and reading one never unpickles anything.

A shard is read only after checks: its header must parse and cover the file, every floating tensor must be finite,
and the user's ``check`` (shapes, value ranges) must pass. A shard that fails is damaged: it is set aside as
``shard-....safetensors.damaged`` (renamed out of the index, not deleted), a one-line warning names it and why,
and its entries read as absent, so their user computes them again. A shard that cannot be written (a full disk, a
read-only folder) is a one-line ``UserError`` naming the folder.

Used by the frozen trunk's state cache (model/pretrained/frozen.py) and the distillation targets
(distill/targets.py).
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path

import numpy as np
import torch
from safetensors import SafetensorError, safe_open

from mtl_decoder.errors import UserError
from mtl_decoder.files import atomic_write_safetensors, check_writable_parent, write_failed

SHARD_GLOB = "shard-*.safetensors"
DAMAGED_SUFFIX = ".damaged"

Check = Callable[[dict[str, torch.Tensor]], str | None]
"""What a user checks of tensors read from a shard (name -> tensor): None when they are sound, else why not."""


class DamagedShard(Exception):
    """A shard that cannot be trusted; its message says why."""


def entry_key(name: str) -> str:
    """The entry a tensor belongs to: its name up to the first '/'."""
    return name.split("/", 1)[0]


def finite(tensors: dict[str, torch.Tensor]) -> str | None:
    """Why some floating tensor holds a NaN or an infinity, or None."""
    for name, t in tensors.items():
        if t.is_floating_point() and not bool(torch.isfinite(t).all()):
            return f"tensor '{name}' holds NaN or infinite values"
    return None


class ShardedStore:
    """Entry key -> the shard holding it, over the shards of ``directory`` (None: nothing on disk)."""

    def __init__(self, directory: Path | None, check: Check | None = None):
        self.directory, self.check = directory, check
        self.location: dict[str, Path] = {}
        """Entry key -> its shard."""
        self.damaged: dict[Path, str] = {}
        """Shards found damaged by this store, and why."""
        self._indexed: set[Path] = set()
        self.rescan()

    def rescan(self) -> None:
        """Index the shards on disk not yet indexed (other runs or processes may have written some since)."""
        if self.directory is None or not self.directory.is_dir():
            return
        for shard in sorted(self.directory.glob(SHARD_GLOB)):
            if shard in self._indexed or shard in self.damaged:
                continue
            try:
                with safe_open(str(shard), framework="pt") as f:
                    names = list(f.keys())
            except (SafetensorError, OSError) as err:
                self._set_aside(shard, f"unreadable header ({_first_line(err)})")
                continue
            self.location.update((entry_key(name), shard) for name in names)
            self._indexed.add(shard)

    def __contains__(self, key: str) -> bool:
        return key in self.location

    def __len__(self) -> int:
        return len(self.location)

    def keys(self) -> Iterable[str]:
        return self.location.keys()

    def read_shard(self, shard: Path) -> dict[str, torch.Tensor] | None:
        """Every tensor of a shard, checked, each a view of one copy-on-write mapping of the file.

        The tensors live in the page cache, not in this process's own memory: the kernel may drop and re-read
        their pages, and processes reading the same shards share them (a training run holding a whole state cache
        no longer needs the cache's size in free memory). One mapping per shard, not per tensor (safetensors maps
        each tensor it returns, and one mapping per entry runs out of the kernel's map count); writing to a tensor
        copies its page, the file is never changed. None when the shard is damaged (then set aside)."""
        return self._read(shard, None)

    def read(self, name: str) -> torch.Tensor | None:
        """One tensor, checked alone (an entry of a single tensor named by its key); None when absent or damaged."""
        shard = self.location.get(entry_key(name))
        if shard is None:
            return None
        found = self._read(shard, [name])
        return None if found is None else found.get(name)

    def _read(self, shard: Path, names: list[str] | None) -> dict[str, torch.Tensor] | None:
        """``names`` copied out of ``shard`` (None: every tensor, as views of one mapping), checked."""
        try:
            with safe_open(str(shard), framework="pt") as f:  # the header parses and covers the file
                present = list(f.keys())
                if names is not None:
                    tensors = {name: f.get_tensor(name).clone() for name in names if name in present}
            if names is None:
                tensors = _mapped(shard, present)
            reason = finite(tensors) or (self.check(tensors) if self.check is not None else None)
            if reason is not None:
                raise DamagedShard(reason)
        except (SafetensorError, OSError, ValueError, RuntimeError, DamagedShard) as err:  # RuntimeError: misaligned
            self._set_aside(shard, _first_line(err))
            return None
        return tensors

    def _set_aside(self, shard: Path, reason: str) -> None:
        """Take a damaged shard out of the index (and out of the folder's, by a rename), saying so once."""
        self.damaged[shard] = reason
        self._indexed.discard(shard)
        self.location = {k: s for k, s in self.location.items() if s != shard}
        aside = shard.with_name(shard.name + DAMAGED_SUFFIX)
        try:
            os.replace(shard, aside)
            where = f"set aside as {aside.name}"
        except FileNotFoundError:
            where = "already set aside by another process"
        except OSError:
            where = "left in place (the folder is not writable)"
        print(f"warning: {shard}: damaged cache shard ({reason}); {where}, its entries are computed again",
              file=sys.stderr, flush=True)  # fmt: skip

    def check_writable(self, what: str) -> None:
        """Check that new shards can be written.

        A one-line UserError now, before any work, when new shards could not be written; ``what`` names the
        setting that chose the folder."""
        if self.directory is None:
            return
        if self.directory.is_dir():
            if not os.access(self.directory, os.W_OK):
                raise UserError(f"{what} {self.directory}: folder is not writable; choose another {what}")
            return
        check_writable_parent(self.directory, what)

    def write(self, tensors: dict[str, torch.Tensor]) -> Path:
        """``tensors`` as one new shard (written whole under a temporary name, then renamed into place)."""
        if self.directory is None:
            raise ValueError("a store without a folder writes nothing")
        final = self.directory / f"shard-{time.time_ns()}-{os.getpid()}.safetensors"
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            raise write_failed(final, err) from None
        atomic_write_safetensors(final, {name: t.contiguous() for name, t in tensors.items()})
        self.location.update((entry_key(name), final) for name in tensors)
        self._indexed.add(final)
        return final


_DTYPES = {
    "F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16, "I64": torch.int64,
    "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8, "BOOL": torch.bool,
}  # fmt: skip
"""safetensors' dtype names (https://github.com/huggingface/safetensors, the format's README) -> torch's."""


def _mapped(path: Path, names: list[str]) -> dict[str, torch.Tensor]:
    """The tensors ``names`` of a safetensors file (its header already parsed by safe_open) as views of one
    copy-on-write mapping: 8 bytes of header length, the JSON header (name -> dtype, shape and byte offsets after
    the header), then the data, each tensor aligned to its element size."""
    raw = torch.from_numpy(np.memmap(path, dtype=np.uint8, mode="c"))  # (file bytes,)
    size = int.from_bytes(raw[:8].numpy().tobytes(), "little")
    header = json.loads(raw[8 : 8 + size].numpy().tobytes())
    tensors = {}
    for name in names:
        entry = header[name]
        begin, end = (8 + size + offset for offset in entry["data_offsets"])
        tensors[name] = raw[begin:end].view(_DTYPES[entry["dtype"]]).reshape(entry["shape"])
    return tensors


def _first_line(err: BaseException) -> str:
    return (str(err).strip().splitlines() or [type(err).__name__])[0]
