"""mtl_decoder.hashing: every hash the package keys caches and fingerprints with, pinned to the values the code
gave before the hashing was gathered in one module (a change would orphan every existing cache and fingerprint)."""

from __future__ import annotations

import hashlib
from pathlib import Path

import torch

from mtl_decoder import hashing
from mtl_decoder.distill.targets import default_cache_root as targets_root
from mtl_decoder.distill.targets import teacher_fingerprint, text_key
from mtl_decoder.model.pretrained.state_cache import StateCache, config_digest
from mtl_decoder.model.pretrained.state_cache import default_cache_root as states_root
from mtl_decoder.training import resume


def _teacher(folder: Path) -> Path:
    folder.mkdir()
    (folder / "config.yaml").write_bytes(b"model: {}\n")
    (folder / "labels.json").write_bytes(b'{"t": ["a"]}')
    return folder


def test_file_hashes_are_those_of_before(tmp_path):
    folder = _teacher(tmp_path / "teacher")
    config = folder / "config.yaml"
    assert hashing.sha256_file(config) == hashlib.sha256(b"model: {}\n").hexdigest()
    assert hashing.sha256_file(config) == "67edb37c140aee9c465a56f0d713e22018f46b3877395d853c4cf4bd95d2731e"
    assert hashing.sha256_file(config, limit=3) == hashlib.sha256(b"mod").hexdigest()
    assert teacher_fingerprint(folder) == "34af03f17b9dc6f7fae866eb9ec059ac"


def test_a_large_files_sampled_fingerprint_is_that_of_before(tmp_path, monkeypatch):
    path = tmp_path / "big.bin"
    path.write_bytes(bytes(range(256)) * 4000)
    monkeypatch.setattr(resume, "FULL_HASH_BYTES", 1000)
    found = resume.fingerprint(path)
    assert found["sha256_sampled"] == "19ca899450dd862a03279480e347ecdc44f37c7057e2be287744fab65670abf1"
    assert found["bytes"] == 1_024_000


def test_tensor_and_config_hashes_are_those_of_before():
    linear = torch.nn.Linear(3, 2)
    with torch.no_grad():
        linear.weight.copy_(torch.arange(6.0).reshape(2, 3))
        linear.bias.copy_(torch.tensor([0.5, -1.0]))
    expected = "08dae3382bc1bb9b23f3e7635da58feb4d028414c9a2e84ceef99743640b2b87"
    assert hashing.tensors_sha256(linear.state_dict().items()) == expected
    running = hashlib.sha256(b"cfg")
    hashing.update_with_tensor(running, "w", torch.arange(4, dtype=torch.float16))
    assert running.hexdigest() == "c582cd3b06f9531e896981e18358913fd02e8de7c06d1cd42a2cfb94f1cb3a37"
    config = {"b": [1, 2], "a": 1, "dtype": "float32", "x": Path("p")}
    assert config_digest(config) == "c019d45af1b54f2e90f07ba8da994f29bab4f4b296586c8f74f3dd7f8a8faac1"


def test_cache_keys_are_those_of_before():
    assert StateCache.key([1, 2, 3]) == "abccad42d03c940bc2b249bf5a4e1e3d"
    assert text_key(["a", "b"]) == "c95b5b0a5d45c522dc032df817b0abc7"


def test_both_caches_read_one_environment_variable(monkeypatch, tmp_path):
    monkeypatch.setenv("MTL_DECODER_CACHE", str(tmp_path))
    assert states_root() == tmp_path / "states" and targets_root() == tmp_path / "targets"
    monkeypatch.delenv("MTL_DECODER_CACHE")
    assert states_root() == Path.home() / ".cache" / "mtl-decoder" / "states"
