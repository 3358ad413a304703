"""The frozen trunk's on-disk state cache: what is read back equals what was written, and reading holds no file
mappings (one per sequence exhausted the kernel's map count on a real 82k-sequence run)."""

from pathlib import Path

import pytest
import torch

from mtl_decoder.model.pretrained.frozen import STORE_DTYPE, StateCache


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
def test_reading_the_cache_keeps_no_file_mapped(tmp_path):
    written = _filled(tmp_path, 200)
    reader = StateCache(tmp_path)

    def mappings() -> int:
        return sum(str(tmp_path) in line for line in Path("/proc/self/maps").read_text().splitlines())

    got = [reader.get(key) for key in written]
    assert all(g is not None for g in got)
    assert mappings() == 0
