"""``model.lexicon``: its values checked in one line naming the key, and ``source: none`` (the default) a config
like one without the section."""

from __future__ import annotations

from pathlib import Path

import pytest

from mtl_decoder.config import LexiconConfig, load_config
from mtl_decoder.errors import ConfigError

DEMO = Path(__file__).resolve().parents[2] / "configs" / "demo.yaml"


@pytest.mark.parametrize(
    ("overrides", "key", "fragment"),
    [
        (["model.lexicon.source=teacher_embedings"], "model.lexicon.source", "did you mean 'teacher_embeddings'"),
        (["model.lexicon.projection=svd"], "model.lexicon.projection", "pca, learned, none"),
        (["model.lexicon.source=teacher_states", "model.lexicon.layer=0"], "model.lexicon.layer", "> 0"),
        (["model.lexicon.source=teacher_embeddings", "model.lexicon.layer=2"], "model.lexicon.layer", "teacher_states"),
        (["model.lexicon.source=teacher_embeddings", "model.lexicon.freeze_steps=-2"], "model.lexicon.freeze_steps",
         "-1 (always frozen)"),
        (["model.lexicon.source=teacher_embeddings", "model.lexicon.projection=learned",
          "model.lexicon.freeze_steps=-1"], "model.lexicon.freeze_steps", "which is projection pca"),
        (["model.lexicon.rms=0"], "model.lexicon.rms", "> 0"),
        (["model.lexicon.words_as_text=true"], "model.lexicon.words_as_text", "set by distill"),
        (["model.lexicon.sorce=none"], "model.lexicon.sorce", "did you mean 'model.lexicon.source'"),
        (["model.lexicon.source=teacher_states", "model.trunk.pretrained=x", "model.trunk.mode=frozen"],
         "model.lexicon.source", "pretrained trunk"),
    ],
)  # fmt: skip
def test_bad_values_are_refused_naming_the_key(overrides, key, fragment):
    with pytest.raises(ConfigError) as info:
        load_config(DEMO, overrides)
    assert info.value.key == key and str(info.value).startswith(f"config key '{key}':")
    assert fragment in str(info.value)


def test_source_none_is_the_config_without_the_section():
    plain = load_config(DEMO)
    assert plain.model.lexicon == LexiconConfig() and not plain.model.lexicon.enabled
    assert load_config(DEMO, ["model.lexicon.source=none"]) == plain
    assert not plain.model.words_as_text  # a native model reads word lists word by word, as before


def test_a_valid_section_reads_from_overrides():
    cfg = load_config(DEMO, ["model.lexicon.source=teacher_states", "model.lexicon.layer=3",
                             "model.lexicon.freeze_steps=-1", "model.lexicon.rms=null"])  # fmt: skip
    lexicon = cfg.model.lexicon
    assert (lexicon.source, lexicon.layer, lexicon.rms, lexicon.frozen) == ("teacher_states", 3, None, True)
