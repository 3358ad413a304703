"""Loading a tokenizer a user names (tokenizer.pretrained) or a model folder holds: custom code is never run
and never asked about, and anything that cannot be loaded is a one-line UserError. No network: a stand-in
``transformers`` module answers as the real one does."""

from __future__ import annotations

import sys
import types

import pytest

from mtl_decoder.data.tokenization import TextEncoder, load_pretrained_tokenizer
from mtl_decoder.errors import UserError

CUSTOM_CODE = (
    "The repository someone/fancy contains custom code which must be executed to correctly load the model. You can "
    "inspect the repository content at https://hf.co/someone/fancy .\n You can inspect the repository content at "
    "https://hf.co/someone/fancy.\nPlease pass the argument `trust_remote_code=True` to allow custom code to be run."
)


def _fake_transformers(monkeypatch, error: Exception) -> list[dict]:
    calls: list[dict] = []

    class AutoTokenizer:
        @staticmethod
        def from_pretrained(name, **kwargs):
            calls.append({"name": name, **kwargs})
            raise error

    monkeypatch.setitem(sys.modules, "transformers", types.SimpleNamespace(AutoTokenizer=AutoTokenizer))
    return calls


def test_a_tokenizer_with_custom_code_is_refused_without_asking(monkeypatch):
    calls = _fake_transformers(monkeypatch, ValueError(CUSTOM_CODE))
    with pytest.raises(UserError) as caught:
        load_pretrained_tokenizer("someone/fancy")
    assert calls == [{"name": "someone/fancy", "use_fast": True, "trust_remote_code": False}]  # never prompts
    message = str(caught.value)
    assert message.startswith("cannot load tokenizer 'someone/fancy' (tokenizer.pretrained): it needs custom code")
    assert "\n" not in message


def test_a_tokenizer_that_cannot_be_found_is_one_line(monkeypatch):
    _fake_transformers(monkeypatch, OSError("someone/missing is not a local folder and is not a valid model id\nmore"))
    with pytest.raises(UserError, match=r"^cannot load tokenizer 'someone/missing' .*not a valid model id$"):
        load_pretrained_tokenizer("someone/missing")


def test_a_damaged_tokenizer_file_is_one_line(tmp_path):
    (tmp_path / "tokenizer.json").write_text('{"version": "1.0", "trunc', encoding="utf-8")
    for load in (lambda: load_pretrained_tokenizer(str(tmp_path)), lambda: TextEncoder.load(tmp_path, 32)):
        with pytest.raises(UserError, match=r"tokenizer\.json: not a readable tokenizer file \(.*\); it must be"):
            load()
