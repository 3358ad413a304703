"""Text -> sub-word ids, with each word's place among them (``WordAlignment``) and character offsets (raw text).

By default a cased WordPiece (or BPE) tokenizer is trained on the tasks' training texts; any Hugging Face
tokenizer (a fast one: its ``tokenizers`` backend is used) can be loaded instead.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

from mtl_decoder.config import ModelConfig, TokenizerConfig
from mtl_decoder.data.alignment import WordAlignment, is_blank
from mtl_decoder.data.recasing import KEEP, Recaser
from mtl_decoder.data.wordpieces import WordPieces, usable
from mtl_decoder.errors import UserError

SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
TOKENIZER_FILE = "tokenizer.json"


@dataclass
class Encoded:
    ids: list[int]
    words: list[str]
    """The words (given, or the pre-tokenizer's words of a raw text)."""
    spans: list[tuple[int, int]] | None
    """For raw text: each word's (start, end) character offsets."""
    alignment: WordAlignment
    """Each word's sub-words, read position and untruncated sub-word count."""

    @property
    def word_index(self) -> list[int]:
        """Per sub-word: its word's number, -1 for special tokens."""
        return self.alignment.word_index

    @property
    def kept_words(self) -> int:
        """Words all of whose sub-words fit in max_length (the rest were cut by truncation)."""
        return self.alignment.kept

    @property
    def truncated(self) -> bool:
        return self.alignment.truncated_words > 0


def train_tokenizer(texts: Iterable[str | list[str]], cfg: TokenizerConfig) -> Tokenizer:
    """A cased BPE/WordPiece/word-level tokenizer trained on ``texts`` (raw strings or word lists)."""
    if cfg.kind == "wordpiece":
        tok = Tokenizer(models.WordPiece(unk_token="[UNK]", max_input_chars_per_word=100))
        trainer = trainers.WordPieceTrainer(
            vocab_size=cfg.vocab_size, min_frequency=cfg.min_frequency, special_tokens=SPECIALS, show_progress=False
        )
        tok.decoder = decoders.WordPiece()
    elif cfg.kind == "wordlevel":
        # Whole words (the pre-tokenizer's), rare ones as [UNK]: shorter sequences than sub-words, and with the
        # character CNN (model.char_embedding) an unseen word is still read letter by letter.
        tok = Tokenizer(models.WordLevel(unk_token="[UNK]"))
        trainer = trainers.WordLevelTrainer(
            vocab_size=cfg.vocab_size, min_frequency=cfg.min_frequency, special_tokens=SPECIALS, show_progress=False
        )
    else:
        # No continuing-subword prefix: with one, `tokenizers` assigns the '##' pieces ids in hash-map order and
        # breaks merge ties by id, so the vocabulary differs run to run (huggingface/tokenizers#1794). Without
        # it, training is deterministic; word boundaries come from the pre-tokenizer either way.
        tok = Tokenizer(models.BPE(unk_token="[UNK]"))
        trainer = trainers.BpeTrainer(
            vocab_size=cfg.vocab_size, min_frequency=cfg.min_frequency, special_tokens=SPECIALS, show_progress=False
        )
    steps = [normalizers.NFC()] + ([normalizers.Lowercase()] if cfg.lowercase else [])
    tok.normalizer = normalizers.Sequence(steps)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.train_from_iterator((t if isinstance(t, str) else " ".join(t) for t in texts), trainer=trainer)
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]",
        special_tokens=[("[CLS]", tok.token_to_id("[CLS]")), ("[SEP]", tok.token_to_id("[SEP]"))],
    )
    return tok


def load_pretrained_tokenizer(name_or_path: str) -> Tokenizer:
    """Load a Hugging Face tokenizer's ``tokenizers`` backend.

    The ``tokenizers`` backend of a Hugging Face tokenizer (id or local path). A tokenizer that needs custom
    code is refused (it is never run), as is one that cannot be loaded: one-line UserErrors."""
    path = Path(name_or_path)
    if path.is_file():
        return read_tokenizer_file(path)
    if (path / TOKENIZER_FILE).is_file():
        return read_tokenizer_file(path / TOKENIZER_FILE)
    from transformers import AutoTokenizer  # heavy: only when a hub tokenizer is asked for

    try:  # trust_remote_code=False: never run a repository's code, and never ask on the terminal whether to
        hf = AutoTokenizer.from_pretrained(name_or_path, use_fast=True, trust_remote_code=False)
    except (OSError, ValueError) as err:
        reason = (str(err).strip().splitlines() or [type(err).__name__])[0]
        if "custom code" in str(err) or "trust_remote_code" in str(err):
            reason = "it needs custom code, which mtl-decoder does not run; use a tokenizer with a tokenizer.json"
        raise UserError(f"cannot load tokenizer '{name_or_path}' (tokenizer.pretrained): {reason}") from None
    if not getattr(hf, "is_fast", False):
        raise UserError(f"tokenizer '{name_or_path}' has no fast (tokenizers) version")
    return hf.backend_tokenizer


def read_tokenizer_file(path: str | Path) -> Tokenizer:
    """A tokenizer.json; a damaged one is a UserError naming it."""
    try:
        return Tokenizer.from_file(str(path))
    except Exception as err:  # tokenizers raises a bare Exception for a file it cannot parse
        reason = (str(err).strip().splitlines() or [type(err).__name__])[0]
        raise UserError(
            f"{path}: not a readable tokenizer file ({reason}); it must be a tokenizer.json as the tokenizers "
            "library saves it (copy it again, or re-save the model)"
        ) from None


def text_word_spans(text: str, enc) -> tuple[list[tuple[int, int]], dict[int, int], list[int]]:
    """The words of a raw text as ``encode_text`` cuts it, from the tokenizer's encoding without special tokens:
    each word's (start, end) character span, the pre-tokenizer's word id -> our word number (ids may skip one), and
    each token's word number (-1: a run of spaces that byte-level BPE made a word of its own)."""
    spans: list[tuple[int, int]] = []
    number: dict[int, int] = {}
    token_word: list[int] = []
    for word, (start, end) in zip(enc.word_ids, enc.offsets, strict=True):
        if word is None or (word not in number and not text[start:end].strip()):
            token_word.append(-1)
            continue
        if word not in number:
            number[word] = len(spans)
            spans.append((start, end))
        else:
            i = number[word]
            spans[i] = (min(spans[i][0], start), max(spans[i][1], end))
        token_word.append(number[word])
    for i, (start, end) in enumerate(spans):  # NFC merges (e + U+0301 -> é) end a word's offsets early
        limit = spans[i + 1][0] if i + 1 < len(spans) else len(text)
        while end < limit and not text[end].isspace():
            end += 1
        while start < end - 1 and text[start].isspace():  # byte-level BPE words carry their leading space
            start += 1
        spans[i] = (start, end)
    return spans, number, token_word


class TextEncoder:
    """Encodes words or raw text to at most ``max_length`` ids, special tokens included."""

    def __init__(
        self,
        tokenizer: Tokenizer,
        max_length: int,
        words_as_text: bool = False,
        word_token: str = "first",
        recaser: Recaser = KEEP,
    ):
        """``word_token``: the sub-word a word's tag is read from, 'first' or 'last' (``model.word_token``, resolved).
        ``words_as_text``: encode a word list as the text of its words joined by single spaces, each token
        assigned to the word it lies in (by its character offsets). A pretrained tokenizer (byte-level BPE,
        SentencePiece) marks a word's leading space in its first token; encoding words one by one
        (``is_pretokenized``) would drop that mark and feed the trunk pieces it never saw in pretraining.
        ``recaser``: how an all-caps line is shown to the tokenizer (``model.all_caps``); the words of the ``Encoded``
        stay the line's own."""
        self.words_as_text, self.word_token, self.recaser = words_as_text, word_token, recaser
        self.tokenizer = tokenizer
        self.tokenizer.no_truncation()
        self.tokenizer.no_padding()
        self.max_length = max_length
        self.n_special = tokenizer.num_special_tokens_to_add(False)
        probe = tokenizer.post_process(tokenizer.encode("a", add_special_tokens=False)).special_tokens_mask
        self.n_lead = next((i for i, special in enumerate(probe) if not special), 0)
        """Special tokens the post-processor puts before the text ([CLS], <s>)."""
        vocab = tokenizer.get_vocab()
        self.pad_id = next((vocab[t] for t in ("[PAD]", "<pad>", "<|endoftext|>", "</s>") if t in vocab), 0)
        self.unk_id = next((vocab[t] for t in ("[UNK]", "<unk>") if t in vocab), self.pad_id)
        self.vocab_size = tokenizer.get_vocab_size()
        self.blank_ids = frozenset(i for t, i in vocab.items() if is_blank(t))
        """Ids of whitespace-only pieces (never a read position)."""
        self.pieces = (
            WordPieces(tokenizer, self.unk_id, self.blank_ids, word_token)
            if not words_as_text and usable(tokenizer)
            else None
        )
        """Word lists assembled from each distinct word's cached sub-words (None: the tokenizer encodes each list)."""

    @classmethod
    def for_model(
        cls, tokenizer: Tokenizer, model: ModelConfig, max_length: int, recaser: Recaser = KEEP
    ) -> TextEncoder:
        """The text encoder a model of this config reads with.

        The encoder a model of this config reads: words joined as text for a pretrained trunk (or a student reading
        with such a teacher's tokenizer), tags read at ``model.word_token`` ('auto' resolved), all-caps lines shown
        as ``recaser`` (``model.all_caps``) shows them."""
        return cls(tokenizer, max_length, model.words_as_text, word_token=model.word_token_position, recaser=recaser)

    def encode_words(self, words: list[str]) -> Encoded:
        shown = self.recaser.words(words)
        if self.pieces is not None:
            enc = self._assembled(shown)
        elif self.words_as_text:
            enc = self._from_joined(shown, self.tokenizer.encode(" ".join(shown), add_special_tokens=False))
        else:
            enc = self._from_words(shown, self.tokenizer.encode(shown, is_pretokenized=True, add_special_tokens=False))
        return self._as_given(words, shown, enc)

    def encode_text(self, text: str) -> Encoded:
        shown = self.recaser.text(text)
        enc = self._from_text(shown, self.tokenizer.encode(shown, add_special_tokens=False))
        return self._as_given(text, shown, enc)

    def encode_batch(self, items: list[list[str] | str]) -> list[Encoded]:
        """``encode_words``/``encode_text`` of each item, the tokenizer running over the whole list at once."""
        if not self.recaser.active:
            return self._encode_batch(items)
        shown = [self.recaser.text(i) if isinstance(i, str) else self.recaser.words(i) for i in items]
        return [self._as_given(*trio) for trio in zip(items, shown, self._encode_batch(shown), strict=True)]

    @staticmethod
    def _as_given(item: list[str] | str, shown: list[str] | str, enc: Encoded) -> Encoded:
        """``enc`` of the recased ``shown`` with the words of ``item`` itself: the recaser keeps every word's length,
        so the spans into the recased text are spans into the text."""
        if shown is not item:
            enc.words = [item[s:e] for s, e in enc.spans] if isinstance(item, str) else list(item)
        return enc

    def _encode_batch(self, items: list[list[str] | str]) -> list[Encoded]:
        texts = [i for i, item in enumerate(items) if isinstance(item, str)]
        lists = [i for i, item in enumerate(items) if not isinstance(item, str)]
        out: list[Encoded | None] = [None] * len(items)
        raw = self.tokenizer.encode_batch([items[i] for i in texts], add_special_tokens=False)
        for i, enc in zip(texts, raw, strict=True):
            out[i] = self._from_text(items[i], enc)
        if self.words_as_text:
            raw = self.tokenizer.encode_batch([" ".join(items[i]) for i in lists], add_special_tokens=False)
            for i, enc in zip(lists, raw, strict=True):
                out[i] = self._from_joined(items[i], enc)
        elif self.pieces is not None:
            for i in lists:
                out[i] = self._assembled(items[i])
        else:
            raw = self.tokenizer.encode_batch([items[i] for i in lists], is_pretokenized=True, add_special_tokens=False)
            for i, enc in zip(lists, raw, strict=True):
                out[i] = self._from_words(items[i], enc)
        return out  # type: ignore[return-value]

    def _assembled(self, words: list[str]) -> Encoded:
        """``_from_words`` of the tokenizer's encoding of ``words``, from their cached sub-words (``WordPieces``)."""
        ids, alignment = self.pieces.encode(words, self.max_length - self.n_special)
        return Encoded(ids, words, None, alignment)

    def _from_words(self, words: list[str], enc) -> Encoded:
        covered = set(enc.word_ids)
        if len(covered) < len(words):  # a word the normalizer erased entirely (e.g. U+200B): make it [UNK]
            unk = self.tokenizer.id_to_token(self.unk_id)
            fixed = [w if i in covered else unk for i, w in enumerate(words)]
            enc = self.tokenizer.encode(fixed, is_pretokenized=True, add_special_tokens=False)
        return self._finish(enc, words, None)

    def _from_joined(self, words: list[str], enc) -> Encoded:
        """Tokens of " ".join(words), each given the word its last character lies in."""
        ends, pos = [], -1
        for w in words:  # ends[k]: the offset of the space after word k (for the last word, the text's end)
            pos += len(w) + 1
            ends.append(pos)
        token_words = self._token_words(enc, len(words), None, ends)
        if len(set(token_words) - {-1}) < len(words):  # a word with no token of its own (not for real words)
            return self._from_words(words, self.tokenizer.encode(words, is_pretokenized=True, add_special_tokens=False))
        return self._finish(enc, words, None, word_ends=ends, token_words=token_words)

    def _from_text(self, text: str, enc) -> Encoded:
        spans, number, _ = text_word_spans(text, enc)
        words = [text[s:e] for s, e in spans]
        return self._finish(enc, words, spans, number)

    def _finish(
        self,
        enc,
        words: list[str],
        spans,
        number: dict[int, int] | None = None,
        word_ends: list[int] | None = None,
        token_words: list[int] | None = None,
    ) -> Encoded:
        """Truncate, add the special tokens and align. ``token_words``: each token's word, if already known."""
        if token_words is None:
            token_words = self._token_words(enc, len(words), number, word_ends)
        subwords = [0] * len(words)  # counted before truncation: what each word takes whole
        for w in token_words:
            if w >= 0:
                subwords[w] += 1
        budget = self.max_length - self.n_special
        if len(enc.ids) > budget:
            enc.truncate(budget)  # keeps the first ``budget`` tokens
            token_words = token_words[:budget]
        enc = self.tokenizer.post_process(enc)  # adds the special tokens: n_lead before the text, the rest after
        word_index = [-1] * self.n_lead + token_words + [-1] * (len(enc.ids) - self.n_lead - len(token_words))
        blank = [i in self.blank_ids for i in enc.ids]
        alignment = WordAlignment.build(word_index, blank, subwords, self.word_token)
        return Encoded(list(enc.ids), words, spans, alignment)

    @staticmethod
    def _token_words(enc, n_words: int, number: dict[int, int] | None, word_ends: list[int] | None) -> list[int]:
        """Each token's word number (-1: a special token, or spaces of a raw text that belong to no word)."""
        if word_ends is not None:  # words joined by spaces: a token's word is where its last character lies
            return [
                -1 if special else _word_of(s, e, word_ends, n_words)
                for (s, e), special in zip(enc.offsets, enc.special_tokens_mask, strict=True)
            ]
        if number is None:
            return [-1 if w is None else w for w in enc.word_ids]
        return [number.get(w, -1) for w in enc.word_ids]

    def save(self, directory: str | Path) -> None:
        """Write tokenizer.json atomically.

        tokenizer.json, whole or not at all (the tokenizers library writes in place and reports a full disk as a
        bare Exception)."""
        from mtl_decoder.files import atomic_write_text

        atomic_write_text(Path(directory) / TOKENIZER_FILE, self.tokenizer.to_str(pretty=True))
        self.recaser.save(directory)

    @classmethod
    def load(
        cls,
        directory: str | Path,
        max_length: int,
        words_as_text: bool = False,
        word_token: str = "first",
        all_caps: str = "keep",
    ) -> TextEncoder:
        """The encoder saved in ``directory`` (its tokenizer.json, and truecase.json for all_caps 'truecase')."""
        path = Path(directory) / TOKENIZER_FILE
        if not path.is_file():
            raise UserError(f"{directory}: no {TOKENIZER_FILE} (is this a model directory?)")
        return cls(read_tokenizer_file(path), max_length, words_as_text, word_token, Recaser.load(directory, all_caps))


def _word_of(start: int, end: int, word_ends: list[int], n_words: int) -> int:
    """The word a token belongs to, from its character offsets.

    The word of words joined by single spaces that a token with these offsets belongs to: the word its last
    character lies in; a token that is only the space before a word (byte-level BPE puts one before digits)
    belongs to the word after it."""
    last = max(start, end - 1)
    word = bisect.bisect_left(word_ends, last)
    if word < n_words and last == word_ends[word] and end - start == 1:  # the separating space itself
        word += 1
    return min(word, n_words - 1)
