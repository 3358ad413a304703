"""The ``model`` section: the decoder trunk's shape and its parts.

``model``: the decoder trunk's shape, its expert blocks, positions and word features (``model.trunk``: trunk.py);
every value checked in ``__post_init__`` with an error naming its key."""

from __future__ import annotations

from dataclasses import dataclass, field

from mtl_decoder.config.checks import check_choice, check_positive
from mtl_decoder.config.lexicon import LexiconConfig
from mtl_decoder.config.trunk import HYBRID_MODES, TrunkConfig, check_trunk_model
from mtl_decoder.config.variants import VARIANTS, Variant
from mtl_decoder.errors import ConfigError

ALL_CAPS_CHOICES = ("keep", "truecase", "title", "lower")
"""``model.all_caps``: how an all-caps line is shown to the tokenizer (data/recasing.py does it)."""

POSITION_EMBEDDINGS = ("rope", "linear", "linear_only")


@dataclass
class ModelConfig:
    d_model: int = 256
    """Width of the residual stream."""
    n_layers: int = 4
    """Number of decoder layers."""
    n_heads: int = 4
    """Attention heads; must divide d_model."""
    attention: str = "causal"
    """'causal' (the decoder form) or 'bidirectional' (every token sees the whole sentence)."""
    norm: str = "rmsnorm"
    """Pre-LN normalisation: 'rmsnorm' or 'layernorm'."""
    ffn: str = "ple"
    """The expert blocks (config/variants.py): 'ple' (PLE, in every layer), 'cgc' (single-level CGC) or 'mmoe' (MMoE),
    both in the top layer over a shared bottom of plain MLPs, 'cgc_stacked' / 'mmoe_stacked' (in every layer, task
    streams from layer 0: ablations), or 'mlp' (hard sharing)."""
    n_shared_experts: int = 2
    """Shared experts per expert layer (every gated variant)."""
    n_task_experts: int = 2
    """Experts per task per expert layer (ple, cgc, cgc_stacked)."""
    expert_hidden: int = 512
    """Hidden size of each SwiGLU expert."""
    mlp_hidden: int | None = None
    """Hidden size of the plain SwiGLU MLPs (every layer of 'mlp', the shared bottom of 'cgc' and 'mmoe'); None = what
    one route sees in a CGC layer ((n_task_experts + n_shared_experts) x expert_hidden), so they compare at equal
    width."""
    initial_shared_weight: float = 0.7
    """Share of every gate's mass on the shared experts at initialisation (0 < w < 1)."""
    dropout: float = 0.1
    """Dropout on the embedding and on each residual branch of the native layers (and in a classifier's hidden
    layer); a pretrained trunk's blocks keep the dropout of their own config (modes upcycle and lora)."""
    rope_base: float = 10000.0
    """Base of the rotary position embedding's frequencies."""
    position_embedding: str = "rope"
    """How positions enter: 'rope' (rotary positions in attention), 'linear' (RoPE plus the position-aware linear
    sub-layer x_i * (1 + alpha_i) + beta_i, (alpha_i, beta_i) read from a learned position table through a linear
    map that starts at zero: the identity at initialisation) or 'linear_only' (the sub-layer without RoPE)."""
    position_embedding_where: str = "input"
    """Where the linear sub-layer sits: 'input' (once, before the first layer) or 'every_layer' (before each)."""
    position_max_length: int = 512
    """Rows of the linear sub-layer's position table: the longest sequence it can place (at least data.max_length;
    a longer one is an error, never interpolated)."""
    position_scale_bound: float | None = None
    """Bound b on the linear sub-layer's scale: alpha = b * tanh(raw / b), so the factor stays in (1 - b, 1 + b)
    (None: unbounded; b <= 1 keeps it positive)."""
    char_embedding: int = 0
    """Width of a character-CNN feature per word added to its sub-words (0 = off). Helps unseen names."""
    word_features: bool = False
    """Add an embedding of each word's shape/case class (Xxxx, XXXX, xxxx, dd, ...) to its sub-words."""
    word_hash_buckets: int = 0
    """Hashed sparse features per word (the word, lower-cased, its 2-4 letter prefixes and suffixes) in this many
    buckets, summed and added to the word's sub-words, as a feature-based CRF tagger sees words (0 = off)."""
    word_hash_dim: int = 64
    """Width of the hashed-feature embedding (projected to d_model)."""
    word_hash_dropout: float = 0.0
    """In training, drop the hashed features that name a word itself (as written and lower-cased; its prefixes and
    suffixes stay) for this fraction of the batch's distinct words, so the tagger also learns to tag a word it has
    not seen from its context and spelling, instead of memorising the training set's names (the singleton-to-UNK
    replacement of Lample et al., 2016). 0 = off; needs word_hash_buckets."""
    all_caps: str = "keep"
    """How a line whose words are all upper case (a headline) is shown to the tokenizer: 'keep' (as it is),
    'truecase' (each word in its most frequent form in the mixed-case training texts, a word not seen there in title
    case; the table is saved with the model as truecase.json), 'title' or 'lower'. Only the sub-word ids change: the
    words the features, the tags and the outputs see are the line's own (data/recasing.py)."""
    tagging_decoder: str = "softmax"
    """How tag sequences are decoded: 'softmax' (per token) or 'crf' (linear-chain CRF, Viterbi)."""
    classifier_hidden: int = 0
    """A classification task's head: 0 = a linear map of the pooled state; N = an MLP with N hidden units (Linear ->
    GELU -> dropout -> Linear). Its cost is per text, not per word: a narrow fast trunk can still have a wide
    sentence path. Tagging heads stay linear."""
    word_token: str = "auto"
    """Which sub-word of a word carries its tag and is read for it: 'first', 'last', or 'auto' (default: the last
    with causal attention, where only a word's last sub-word has seen the whole word; the first otherwise). A lone
    whitespace piece (byte-level 'Ġ' before a number, SentencePiece '▁') is never read (data/alignment.py). Model
    folders saved before 'auto' was the default read as 'first', as they were trained."""
    trunk: TrunkConfig = field(default_factory=TrunkConfig)
    """A pretrained trunk; with one, d_model/n_heads/norm describe only the native layers of mode 'frozen', and the
    tokenizer and maximum length come from the checkpoint."""
    lexicon: LexiconConfig = field(default_factory=LexiconConfig)
    """A distilled native student's token-embedding table inherited from its teacher (config/lexicon.py)."""

    def __post_init__(self) -> None:
        for name in ("d_model", "n_layers", "n_heads", "expert_hidden"):
            check_positive(name, getattr(self, name), allow_zero=name == "n_layers" and self.trunk.mode in HYBRID_MODES)
        check_trunk_model(self)
        if self.d_model % self.n_heads or (self.d_model // self.n_heads) % 2:
            raise ConfigError("n_heads", f"d_model {self.d_model} / n_heads {self.n_heads} must be an even integer")
        check_choice("attention", self.attention, ("causal", "bidirectional"))
        check_choice("norm", self.norm, ("rmsnorm", "layernorm"))
        check_choice("ffn", self.ffn, tuple(VARIANTS))
        check_choice("tagging_decoder", self.tagging_decoder, ("softmax", "crf"))
        check_choice("word_token", self.word_token, ("first", "last", "auto"))
        check_choice("position_embedding", self.position_embedding, POSITION_EMBEDDINGS)
        check_choice("position_embedding_where", self.position_embedding_where, ("input", "every_layer"))
        check_positive("position_max_length", self.position_max_length)
        if self.position_scale_bound is not None:
            check_positive("position_scale_bound", self.position_scale_bound)
        if self.variant.gated:
            check_positive("n_shared_experts", self.n_shared_experts)
        if self.variant.task_experts:
            check_positive("n_task_experts", self.n_task_experts)
        if self.mlp_hidden is not None:
            check_positive("mlp_hidden", self.mlp_hidden)
        if not 0.0 < self.initial_shared_weight < 1.0:
            raise ConfigError(
                "initial_shared_weight", f"must lie strictly between 0 and 1, got {self.initial_shared_weight}"
            )
        if not 0.0 <= self.dropout < 1.0:
            raise ConfigError("dropout", f"must lie in [0, 1), got {self.dropout}")
        if 0.0 < self.dropout < 2.0**-16:  # the model's dropout draws 16 bits per element (model/layers.py)
            raise ConfigError("dropout", f"{self.dropout} is below 1/65,536, the smallest dropout drawn; use 0 or more")
        check_positive("char_embedding", self.char_embedding, allow_zero=True)
        check_positive("classifier_hidden", self.classifier_hidden, allow_zero=True)
        check_positive("word_hash_buckets", self.word_hash_buckets, allow_zero=True)
        if self.word_hash_buckets == 1:
            raise ConfigError("word_hash_buckets", "must be 0 (off) or at least 2")
        check_positive("word_hash_dim", self.word_hash_dim)
        if not 0.0 <= self.word_hash_dropout < 1.0:
            raise ConfigError("word_hash_dropout", f"must lie in [0, 1), got {self.word_hash_dropout}")
        if self.word_hash_dropout and not self.word_hash_buckets:
            raise ConfigError("word_hash_dropout", "drops hashed word features: set model.word_hash_buckets too")
        check_choice("all_caps", self.all_caps, ALL_CAPS_CHOICES)
        if self.lexicon.enabled and self.trunk.enabled:
            raise ConfigError(
                "lexicon.source",
                f"'{self.lexicon.source}' gives a native student its teacher's table: a model with a pretrained trunk "
                "(model.trunk.pretrained) reads its own checkpoint's",
            )

    @property
    def words_as_text(self) -> bool:
        """Whether a word list is encoded as the text of its words joined by spaces (``TextEncoder``).

        True for a pretrained trunk (its tokenizer marks a word's leading space) and for a student reading with such
        a teacher's tokenizer (``lexicon.words_as_text``)."""
        return self.trunk.enabled or self.lexicon.words_as_text

    @property
    def word_token_position(self) -> str:
        """'first' or 'last': ``word_token`` with 'auto' resolved by the attention mode."""
        if self.word_token == "auto":
            return "last" if self.attention == "causal" else "first"
        return self.word_token

    @property
    def variant(self) -> Variant:
        return VARIANTS[self.ffn]

    @property
    def mlp_width(self) -> int:
        return self.mlp_hidden or (self.n_task_experts + self.n_shared_experts) * self.expert_hidden
