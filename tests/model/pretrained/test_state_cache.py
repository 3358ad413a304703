"""The frozen trunk's on-disk state cache: what is read back equals what was written, and reading holds at most one
file mapping per shard (one per sequence exhausted the kernel's map count on a real 82k-sequence run)."""

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from mtl_decoder.model.pretrained.state_cache import STORE_DTYPE, StateCache


def _filled(directory: Path, n: int) -> dict[str, torch.Tensor]:
    cache = StateCache(directory, flush_every=n // 2)
    written = {}
    for i in range(n):
        key = StateCache.key([i, i + 1, i + 2])
        written[key] = torch.randn(3 + i % 4, 8)
        cache.put(key, written[key])
    cache.flush()
    return written


def test_states_read_back_from_shards_equal_what_was_written(tmp_path):
    written = _filled(tmp_path, 10)
    assert len(list(tmp_path.glob("shard-*.safetensors"))) == 2
    reader = StateCache(tmp_path)
    assert len(reader) == 10
    for key, states in written.items():
        torch.testing.assert_close(reader.get(key), states.to(STORE_DTYPE))
    assert reader.get(StateCache.key([99])) is None


@pytest.mark.skipif(not Path("/proc/self/maps").exists(), reason="counts mappings through Linux /proc")
def test_reading_the_cache_maps_each_shard_once_not_each_sequence(tmp_path):
    written = _filled(tmp_path, 200)  # two shards of 100 sequences
    reader = StateCache(tmp_path)

    def mappings() -> int:
        return sum(str(tmp_path) in line for line in Path("/proc/self/maps").read_text().splitlines())

    got = [reader.get(key) for key in written]
    assert all(g is not None for g in got)
    assert mappings() == len(list(tmp_path.glob("shard-*.safetensors"))) == 2
    del got
    reader.memory.clear()
    assert mappings() == 0  # released with the states


def test_a_folder_in_the_format_written_before_reads_back(tmp_path):
    """The on-disk format: shard-<ns>-<pid>.safetensors holding one float16 (T, H) tensor per key, by hand."""
    written = {StateCache.key([i, 7]): torch.randn(2 + i, 8).to(STORE_DTYPE) for i in range(3)}
    save_file(written, str(tmp_path / "shard-1700000000000000000-42.safetensors"))
    for bound in (None, 2):
        reader = StateCache(tmp_path, max_entries=bound)
        assert all(torch.equal(reader.get(key), states) for key, states in written.items())


@pytest.mark.parametrize("bound", [None, 4])
@pytest.mark.parametrize("how", ["truncated", "NaN", "not states"])
def test_a_damaged_shard_is_set_aside_and_its_states_are_computed_again(tmp_path, capsys, how, bound):
    written = _filled(tmp_path, 4)  # one shard of 2 keys, one of 2
    shard = sorted(tmp_path.glob("shard-*.safetensors"))[0]
    keys = list(load_file(shard))
    if how == "truncated":
        shard.write_bytes(shard.read_bytes()[:-5])
    else:
        bad = {k: written[k].to(STORE_DTYPE) for k in keys}
        bad[keys[0]] = bad[keys[0]].float() if how == "not states" else bad[keys[0]] * float("nan")
        save_file(bad, str(shard))
    reader = StateCache(tmp_path, max_entries=bound)
    assert [reader.lookup(key) for key in keys] == [None, None] and reader.misses == 2  # computed again
    assert f"warning: {shard}: damaged cache shard" in capsys.readouterr().err
    others = [k for k in written if k not in keys]
    torch.testing.assert_close(reader.get(others[0]), written[others[0]].to(STORE_DTYPE))  # the sound shard
