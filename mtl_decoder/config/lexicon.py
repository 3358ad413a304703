"""``model.lexicon``: a distilled student's token-embedding table, inherited from its teacher.

A native student that inherits its teacher's lexicon reads with the teacher's tokenizer, and its token-embedding
table starts as a table the teacher holds (its own embedding table, or a static vector per vocabulary item read
from its states), projected to the student's width. At prediction the student looks the rows up like any native
model's: the teacher is needed only while the table is made (``mtl-decoder distill``, distill/lexicon.py)."""

from __future__ import annotations

from dataclasses import dataclass

from mtl_decoder.config.checks import check_choice, check_positive
from mtl_decoder.errors import ConfigError

LEXICON_SOURCES = ("none", "teacher_embeddings", "teacher_states")
LEXICON_PROJECTIONS = ("pca", "learned", "none")


@dataclass
class LexiconConfig:
    """What a distilled native student inherits of its teacher's lexicon (``source: none``: nothing)."""

    source: str = "none"
    """'none' (the student's own tokenizer and a random table, as without this section), 'teacher_embeddings' (the
    teacher's token-embedding table: a native teacher's own, a pretrained trunk's the checkpoint's input
    embeddings, read with safetensors) or 'teacher_states' (static vectors as in Model2Vec: each vocabulary item of
    the teacher's tokenizer run alone through the teacher's trunk, its state after block ``layer`` kept). Either
    makes the student read with the teacher's tokenizer; needs ``mtl-decoder distill``."""
    layer: int | None = None
    """'teacher_states': the block (1-based) whose states are kept, through the trunk's final norm (None: the middle
    block of the teacher's, half its blocks rounded down, at least 1)."""
    projection: str = "pca"
    """How the teacher's rows reach the student's width: 'pca' (centred, onto the top d_model principal directions,
    each direction's sign fixed so its largest entry is positive, so a run reproduces), 'learned' (the centred rows
    kept whole and frozen, and a teacher-width x d_model projection of them trained with the student, started at
    the PCA directions; folded into one table when the student is saved, so prediction is still one lookup) or
    'none' (the rows as they are: the teacher's width must be the student's d_model)."""
    rms: float | None = 0.02
    """The table is scaled (one factor for all of it) so the root mean square of its entries is this: 0.02 is the
    student's own random table (N(0, 0.02)), so the inherited one starts on the scale of the word features added to
    it and of the optimiser's steps (None: the projection's own scale)."""
    freeze_steps: int = 0
    """Optimiser steps for which the inherited table (with projection 'learned': the projection) is held (learning
    rate 0) while the rest of the student trains, after which it is fine-tuned on the run's schedule (0: fine-tuned
    from the first step; -1: frozen for the whole run, no gradient; not with 'learned', which is then 'pca')."""
    words_as_text: bool = False
    """Set by distill: the teacher's tokenizer reads a word list as the text of its words joined by spaces (a
    pretrained trunk's does, marking a word's leading space in its first piece), so the student reads words as its
    teacher did and meets the rows the teacher's table holds for them."""

    def __post_init__(self) -> None:
        check_choice("source", self.source, LEXICON_SOURCES)
        check_choice("projection", self.projection, LEXICON_PROJECTIONS)
        if self.layer is not None:
            check_positive("layer", self.layer)
            if self.source != "teacher_states":
                raise ConfigError(
                    "layer", "is the teacher block whose states are kept: set model.lexicon.source=teacher_states too"
                )
        if self.rms is not None:
            check_positive("rms", self.rms)
        if self.freeze_steps < -1:
            raise ConfigError("freeze_steps", f"must be -1 (always frozen) or >= 0, got {self.freeze_steps}")
        if self.projection == "learned" and self.freeze_steps == -1:
            raise ConfigError(
                "freeze_steps", "-1 freezes the projection for the whole run, which is projection pca: use pca"
            )
        if self.words_as_text and not self.enabled:
            raise ConfigError("words_as_text", "is set by distill for a student that inherits a lexicon (source)")

    @property
    def enabled(self) -> bool:
        return self.source != "none"

    @property
    def frozen(self) -> bool:
        """Whether the table is frozen for the whole run (no gradient at all)."""
        return self.freeze_steps == -1
