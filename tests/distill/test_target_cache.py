"""The distillation target cache on disk: folders written before the shared store still read, and a damaged shard
(overwritten in place, truncated, random bytes, empty, wrong-shaped, NaN) is set aside naming it, its texts then
absent (labelled again), never used; a full disk is a one-line error naming the shard."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from mtl_decoder.distill.targets import SPANS, TargetStore, text_key
from mtl_decoder.errors import UserError

SHAPES = {"ner": (2, 3), "sentiment": (1, 2)}


def entries() -> dict[str, dict[str, torch.Tensor]]:
    gen = torch.Generator().manual_seed(0)
    return {
        text_key(["a", "b"]): {
            "ner": torch.randn(2, 3, generator=gen).softmax(-1).half(),
            "sentiment": torch.randn(2, generator=gen).softmax(-1).half(),
        },
        text_key("c d"): {
            "ner": torch.randn(2, 3, generator=gen).softmax(-1).half(),
            "sentiment": torch.randn(2, generator=gen).softmax(-1).half(),
            SPANS: torch.tensor([[0, 1], [2, 3]], dtype=torch.int32),
        },
    }


def flat(found: dict[str, dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    return {f"{key}/{part}": t for key, parts in found.items() for part, t in parts.items()}


def test_a_folder_in_the_format_written_before_reads_back(tmp_path):
    """The on-disk format: shard-<ns>-<pid>.safetensors holding 'KEY/PART' tensors, written here by hand."""
    written = entries()
    save_file(flat(written), str(tmp_path / "shard-1700000000000000000-42.safetensors"))
    store = TargetStore(tmp_path, shapes=SHAPES)
    store.load(list(written))
    assert len(store) == 2
    for key, parts in written.items():
        got = store.get(key)
        assert got.keys() == parts.keys() and all(torch.equal(got[p], parts[p]) for p in parts)


def test_shards_written_now_keep_that_format(tmp_path):
    store = TargetStore(tmp_path)
    for key, parts in entries().items():
        store.put(key, parts)
    store.flush()
    (shard,) = tmp_path.glob("*")
    assert shard.name.startswith("shard-") and shard.name.endswith(f"-{os.getpid()}.safetensors")
    from safetensors.torch import load_file

    assert load_file(shard).keys() == flat(entries()).keys()


def damage(shard: Path, how: str) -> None:
    data = shard.read_bytes()
    if how == "overwritten in place":  # the same names, values that are not probabilities
        written = entries()
        for parts in written.values():
            parts["sentiment"] = parts["sentiment"] * 3
        save_file(flat(written), str(shard))
    elif how == "truncated":
        shard.write_bytes(data[: len(data) - 7])
    elif how == "random bytes":
        shard.write_bytes(os.urandom(len(data)))
    elif how == "empty":
        shard.write_bytes(b"")
    elif how == "wrong-shaped":
        written = entries()
        written[text_key("c d")]["ner"] = torch.full((2, 4), 0.25).half()  # 4 labels where ner has 3
        save_file(flat(written), str(shard))
    elif how == "NaN":
        written = entries()
        written[text_key(["a", "b"])]["ner"][0, 0] = float("nan")
        save_file(flat(written), str(shard))


@pytest.mark.parametrize("how", ["overwritten in place", "truncated", "random bytes", "empty", "wrong-shaped", "NaN"])
def test_a_damaged_shard_is_set_aside_naming_it_and_its_texts_are_absent(tmp_path, capsys, how):
    store = TargetStore(tmp_path)
    for key, parts in entries().items():
        store.put(key, parts)
    store.flush()
    (shard,) = tmp_path.glob("shard-*.safetensors")
    damage(shard, how)

    reader = TargetStore(tmp_path, shapes=SHAPES)
    keys = list(entries())
    reader.load(keys)
    assert all(key not in reader for key in keys) and len(reader) == 0  # labelled again, never used
    warning = capsys.readouterr().err.strip().splitlines()
    assert len(warning) == 1 and warning[0].startswith(f"warning: {shard}: damaged cache shard")
    assert not shard.exists() and shard.with_name(shard.name + ".damaged").is_file()  # kept, out of the way

    for key, parts in entries().items():  # relabelled: the new shard reads back
        reader.put(key, parts)
    reader.flush()
    again = TargetStore(tmp_path, shapes=SHAPES)
    again.load(keys)
    assert all(torch.equal(again.get(k)["ner"], entries()[k]["ner"]) for k in keys)


def test_a_full_disk_is_one_line_naming_the_shard(tmp_path, monkeypatch):
    def full(tensors, path, metadata=None):
        Path(path).write_bytes(b"partial")
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr("safetensors.torch.save_file", full)  # under files.atomic_write_safetensors
    store = TargetStore(tmp_path / "cache")
    store.put(text_key("x"), {"sentiment": torch.tensor([0.5, 0.5]).half()})
    with pytest.raises(UserError) as err:
        store.flush()
    message = str(err.value)
    assert "\n" not in message and "No space left on device" in message
    assert message.startswith(str(tmp_path / "cache" / "shard-")) and ".safetensors: cannot write" in message
    assert list((tmp_path / "cache").iterdir()) == []  # no partial shard or temporary left


def test_safetensors_wrapped_disk_errors_read_as_their_reason():
    from safetensors import SafetensorError

    from mtl_decoder.files import write_reason

    err = SafetensorError(
        'Error while serializing: IoError(Os { code: 28, kind: StorageFull, message: "No space left on device" })'
    )
    assert write_reason(err) == "No space left on device"
