"""model.all_caps=truecase through the CLI on a tiny frozen trunk: the table built from the training texts and saved
in the model folder (listed in its manifest), the trunk reading a headline as its recased words, the outputs keeping
the headline's own words, and a folder without its table refused."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

pytest.importorskip("transformers")

from helpers import FIXTURES, tiny_config
from hf_testkit import tiny_checkpoint

from mtl_decoder.cli import main
from mtl_decoder.data.recasing import TABLE_FILE
from mtl_decoder.data.tokenization import TextEncoder
from mtl_decoder.model.pretrained.hub import load_tokenizer
from mtl_decoder.saved import MANIFEST_FILE, load_model

HEADLINE = "PALESTINIAN OFFICIALS ACCUSED NETANYAHU OF ZORBLING ."


def _usual_forms() -> dict[str, str]:
    """Each lower-cased word of the fixtures' mixed-case lines, not first in its line, and its most common form."""
    counts: dict[str, Counter] = {}
    for name in ("ner_train.jsonl", "sentiment_train.jsonl"):
        for line in (FIXTURES / name).read_text(encoding="utf-8").splitlines():
            row = json.loads(line)
            words = row.get("tokens") or row["text"].split()
            text = "".join(words)
            if not (any(c.isupper() for c in text) and any(c.islower() for c in text)):
                continue
            for word in words[1:]:
                if any(c.isalpha() for c in word):
                    counts.setdefault(word.lower(), Counter())[word] += 1
    return {k: c.most_common(1)[0][0] for k, c in counts.items()}


@pytest.fixture(scope="module")
def best(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("all-caps")
    checkpoint = tiny_checkpoint(root / "llama", "llama")
    overrides = [
        f"model.trunk.pretrained={checkpoint}",
        f"model.trunk.cache_dir={root / 'cache'}",
        "model.all_caps=truecase",
        "training.max_steps=4",
        "training.eval_every=4",
        "training.epochs=1",
    ]
    config = tiny_config(root / "run", overrides)
    config.save(root / "c.yaml")
    assert main(["train", "--config", str(root / "c.yaml")]) == 0
    return root / "run" / "best"


def test_the_table_is_the_training_texts_usual_forms_and_listed_in_the_manifest(best):
    table = json.loads((best / TABLE_FILE).read_text(encoding="utf-8"))
    for key, form in _usual_forms().items():
        assert table[key] == form
    assert table["officials"] == "officials" and table["netanyahu"] == "Netanyahu"
    assert TABLE_FILE in json.loads((best / MANIFEST_FILE).read_text())
    card = (best / "README.md").read_text()
    assert "all-caps lines (headlines) reach the tokenizer in each word's usual case" in card


def test_a_headline_reaches_the_trunk_recased_and_leaves_with_its_own_words(best, tmp_path):
    saved = load_model(best)
    plain = TextEncoder(load_tokenizer(saved.config.model.trunk), saved.config.data.max_length, words_as_text=True)
    recased = "Palestinian officials accused Netanyahu of Zorbling ."  # Zorbling: never seen, title case
    assert saved.encoder.encode_text(HEADLINE).ids == plain.encode_text(recased).ids
    source = tmp_path / "in.jsonl"
    source.write_text(json.dumps({"tokens": HEADLINE.split()}) + "\n" + json.dumps({"text": HEADLINE}) + "\n")
    out = tmp_path / "out.jsonl"
    assert main(["predict", "--model", str(best), "--input", str(source), "--output", str(out)]) == 0
    words, text = (json.loads(line) for line in out.read_text().splitlines())
    assert words["tokens"] == text["predictions"]["ner"]["words"] == HEADLINE.split()
    assert [HEADLINE[s:e] for s, e in text["predictions"]["ner"]["offsets"]] == HEADLINE.split()
    entities = words["predictions"]["ner"]["entities"]
    assert all(e["text"] == " ".join(HEADLINE.split()[e["start"] : e["end"]]) for e in entities)
    assert words["predictions"]["ner"]["tags"] == text["predictions"]["ner"]["tags"]  # the same ids either way


def test_a_folder_without_its_table_is_refused_by_name(best, tmp_path, capsys):
    import shutil

    folder = tmp_path / "best"
    shutil.copytree(best, folder)
    (folder / TABLE_FILE).unlink()
    source = tmp_path / "in.txt"
    source.write_text(HEADLINE + "\n")
    code = main(["predict", "--model", str(folder), "--input", str(source), "--output", str(tmp_path / "o.jsonl")])
    assert code == 2 and TABLE_FILE in capsys.readouterr().err
    assert not (tmp_path / "o.jsonl").exists()
