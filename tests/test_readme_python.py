"""Every ```python block of README.md runs as written, in a folder holding the repository's configs and tasks, with
training cut to a few steps of a tiny model (``load_config`` gets extra overrides) so that it takes seconds; and a
second run of the README's training into the same folder stops with an error naming ``train``'s arguments, not the
command's flags."""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

import pytest

import mtl_decoder
from mtl_decoder.errors import UserError

REPO = Path(__file__).resolve().parent.parent
SHORT = [
    "model.d_model=32", "model.n_heads=2", "model.expert_hidden=32", "model.char_embedding=8",
    "model.word_hash_buckets=512", "model.word_hash_dim=8", "tokenizer.vocab_size=400", "data.max_length=48",
    "training.max_steps=4", "training.progress=false",
]  # fmt: skip
"""Overrides after the README's own: a tiny model, four steps."""


def python_blocks(text: str) -> list[str]:
    """The code of every fenced ```python block of a Markdown text, in order."""
    return re.findall(r"^```python\n(.*?)^```", text, flags=re.DOTALL | re.MULTILINE)


def test_python_blocks_are_found():
    assert python_blocks("a\n```python\nx = 1\n```\n```bash\nls\n```\n```python\ny = 2\n```\n") == [
        "x = 1\n",
        "y = 2\n",
    ]


@pytest.fixture
def short_training(tmp_path, monkeypatch) -> Path:
    """cwd: a folder with the repository's configs/ and tasks/; ``mtl_decoder.load_config`` with SHORT appended."""
    for name in ("configs", "tasks"):
        (tmp_path / name).symlink_to(REPO / name)
    monkeypatch.chdir(tmp_path)
    real = mtl_decoder.load_config

    def shortened(path, overrides=(), **kwargs):
        return real(path, [*overrides, *SHORT], **kwargs)

    monkeypatch.setattr(mtl_decoder, "load_config", shortened)
    return tmp_path


def test_every_python_block_of_the_readme_runs(short_training):
    blocks = python_blocks((REPO / "README.md").read_text(encoding="utf-8"))
    assert blocks, "README.md has no python block"
    for number, code in enumerate(blocks, 1):
        printed = io.StringIO()
        with contextlib.redirect_stdout(printed):
            exec(compile(code, f"README.md python block {number}", "exec"), {"__name__": "__readme__"})
        assert printed.getvalue().strip(), f"block {number} printed nothing"
    lines = printed.getvalue().splitlines()[-3:]  # the training block's own: the score, then one line per text
    assert lines[0].startswith("selection score on test: ")
    assert all(line.rstrip().split()[-1] in ("positive", "negative") for line in lines[1:])
    assert (short_training / "runs" / "quick" / "best" / "model.safetensors").is_file()

    code = next(b for b in blocks if "train(" in b)
    rerun = code.split("\nmetrics =")[0]  # the training line again, into the same folder
    with pytest.raises(UserError) as caught:
        exec(compile(rerun, "README.md again", "exec"), {"__name__": "__readme__"})
    message = str(caught.value)
    assert "already holds a run" in message and "resume=True" in message and "overwrite=True" in message
    assert "--resume" not in message and "--overwrite" not in message and "--output-dir" not in message
