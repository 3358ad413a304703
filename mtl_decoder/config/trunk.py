"""``model.trunk``: a pretrained Hugging Face causal LM as the trunk, and how it is trained and saved."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from mtl_decoder.config.checks import check_choice, check_positive
from mtl_decoder.errors import ConfigError

TRUNK_MODES = ("upcycle", "lora", "frozen", "hybrid", "echo", "echo_hybrid")
TRUNK_DTYPES = ("float32", "bfloat16", "float16")
LAYER_MIXES = ("scalar_mix", "concat")
_REGISTERED_MODES: list[str] = []
"""Modes of the ways of reading a trunk registered beside the built-in ones (model.trunks.register_trunk)."""
_REGISTERED_CACHED: list[str] = []
"""The registered modes whose states are cached (their trunks' ``caches_states``)."""
CACHED_MODES = ("frozen", "hybrid", "echo", "echo_hybrid")
"""Modes whose trunk states (all of it, or its lower blocks) are computed once per token sequence and cached."""
HYBRID_MODES = ("hybrid", "echo_hybrid")
"""Modes that train the top ``train_top`` blocks over the cached lower ones (the keys that say "Mode 'hybrid'")."""


@dataclass
class TrunkConfig:
    """A pretrained Hugging Face causal LM as the trunk (``pretrained`` unset: the native trunk, from scratch)."""

    pretrained: str | None = None
    """A hub id (e.g. HuggingFaceTB/SmolLM2-135M), a local checkpoint folder, or a .gguf file; Llama-style (Llama,
    Mistral, Qwen2/3, SmolLM) and GPT-2 families, through transformers' own classes."""
    revision: str | None = None
    """Hub revision (branch, tag or commit) of ``pretrained``."""
    mode: str = "frozen"
    """'upcycle': every layer's MLP becomes its expert block, every expert a copy of the pretrained MLP (the model
    computes exactly the pretrained function at step 0), all weights trained. 'lora': the pretrained weights frozen,
    each expert the frozen MLP plus its own low-rank update. 'frozen': the trunk frozen, its hidden states at
    ``layers`` computed once per text and cached on disk, native PLE layers (model.n_layers) trained on top.
    'hybrid': the lower blocks frozen and cached as in 'frozen', the top ``train_top`` pretrained blocks trained on
    top of the cache (``top_mode``), then the native PLE layers (model.n_layers, 0 for none). 'echo': as 'frozen',
    each text read twice and the states of its second copy kept (every token has seen the whole text).
    'echo_hybrid': as 'hybrid', its cached blocks reading each text twice as 'echo' does."""
    layers: int | None = None
    """Keep the first N pretrained blocks (None: all; with ``read_layers``: its highest block)."""
    read_layers: list[int] | None = None
    """Mode 'frozen': the blocks whose states the layers on top read (1-based, e.g. [8, 16, 24]), each cached on its
    own and combined by ``layer_mix`` (None: the last kept block alone, through the trunk's final norm)."""
    layer_mix: str = "scalar_mix"
    """How ``read_layers`` are combined: 'scalar_mix' (ELMo: each layer normed, a softmax-weighted sum times a learned
    scale, one mix per route the first layer reads, so tasks can prefer different layers) or 'concat' (the normed
    layers side by side, projected)."""
    train_top: int = 2
    """Modes 'hybrid' and 'echo_hybrid': how many of the top kept blocks are trained on the cached states of the
    blocks below."""
    top_mode: str = "upcycle"
    """Modes 'hybrid' and 'echo_hybrid': how the top blocks train: 'upcycle' (each MLP becomes its expert block of
    trained copies, all their weights trained) or 'lora' (frozen, each expert the MLP plus its own low-rank update)."""
    top_attention: str = "causal"
    """Modes 'hybrid' and 'echo_hybrid': attention in the trained top blocks: 'causal' (as pretrained, so step 0
    computes the pretrained function; the native layers above follow model.attention) or 'bidirectional' (the
    causal mask lifted, as model.attention=bidirectional does in modes upcycle and lora; for model.n_layers 0)."""
    dtype: str = "float32"
    """Weights of the pretrained trunk: 'float32', 'bfloat16' or 'float16' (the last two for GPUs)."""
    lora_rank: int = 8
    """Rank of each expert's low-rank update (mode 'lora')."""
    lora_alpha: float = 16.0
    """LoRA scaling numerator: updates are scaled by lora_alpha / lora_rank."""
    lora_attention: bool = False
    """Mode 'lora': also put one low-rank update on the attention projections (shared by all routes)."""
    cache_dir: str | None = None
    """Modes 'frozen' and 'hybrid': where hidden states are cached (default ~/.cache/mtl-decoder/states); keyed by
    the base model's weights hash, the layer and the token ids, so runs can share it."""
    save: str = "reference"
    """What best/ stores of a frozen or LoRA trunk: 'reference' (its id or path and a hash of its weights, checked
    on load) or 'full' (the pretrained weights too, so the folder stands alone)."""
    gradient_checkpointing: bool = False
    """Recompute the trunk's activations in the backward pass (modes 'upcycle' and 'lora'): less memory, ~30% more
    compute; for large trunks."""

    def __post_init__(self) -> None:
        check_choice("mode", self.mode, (*TRUNK_MODES, *_REGISTERED_MODES))
        check_choice("dtype", self.dtype, TRUNK_DTYPES)
        check_choice("save", self.save, ("reference", "full"))
        if self.layers is not None:
            check_positive("layers", self.layers)
        check_positive("lora_rank", self.lora_rank)
        check_positive("lora_alpha", self.lora_alpha)
        check_choice("layer_mix", self.layer_mix, LAYER_MIXES)
        check_choice("top_mode", self.top_mode, ("upcycle", "lora"))
        check_choice("top_attention", self.top_attention, ("causal", "bidirectional"))
        check_positive("train_top", self.train_top)
        if self.read_layers is not None:
            self._check_read_layers()
        if self.mode in HYBRID_MODES and self.save == "full":
            raise ConfigError(
                "save",
                f"'full' is not supported in mode {self.mode} yet (its top blocks are trained, its lower ones "
                "cached): use 'reference', which records the checkpoint's path or id and the hash of its weights",
            )
        if self.mode in HYBRID_MODES and self.layers is not None and self.train_top >= self.layers:
            raise ConfigError(
                "train_top",
                f"{self.train_top} trained blocks leave none of the {self.layers} kept blocks (layers) to cache: "
                "use fewer, or mode upcycle/lora to train them all",
            )

    def _check_read_layers(self) -> None:
        blocks = self.read_layers
        if self.mode != "frozen":
            raise ConfigError("read_layers", f"reads several blocks in mode 'frozen' only, not '{self.mode}'")
        if not blocks or any(not isinstance(b, int) or isinstance(b, bool) or b < 1 for b in blocks):
            raise ConfigError("read_layers", f"expected a list of block numbers >= 1 (e.g. [8, 16, 24]), got {blocks}")
        if blocks != sorted(set(blocks)):
            raise ConfigError("read_layers", f"list each block once, in increasing order, got {blocks}")
        if self.layers is None:
            self.layers = blocks[-1]  # the blocks above the highest one read would run for nothing
        elif blocks[-1] != self.layers:
            raise ConfigError(
                "read_layers",
                f"its highest block ({blocks[-1]}) must be the last kept one (layers={self.layers}): blocks above it "
                f"would run for nothing; set model.trunk.layers={blocks[-1]} or leave it unset",
            )

    @property
    def caches_states(self) -> bool:
        """Whether (part of) the trunk's states are computed once per token sequence and cached."""
        return self.enabled and (self.mode in CACHED_MODES or self.mode in _REGISTERED_CACHED)

    @property
    def mixes_layers(self) -> bool:
        """Whether several blocks are read (otherwise the last kept block alone, as before read_layers)."""
        return self.read_layers is not None and self.read_layers != [self.layers]

    @property
    def enabled(self) -> bool:
        return self.pretrained is not None


def allow_trunk_mode(name: str, caches_states: bool = False) -> None:
    """Accept ``name`` as a model.trunk.mode.

    ``name`` is a way of reading a trunk registered by model.trunks.register_trunk; ``caches_states``: its states are
    computed once per token sequence and cached, as mode frozen's."""
    if name not in TRUNK_MODES and name not in _REGISTERED_MODES:
        _REGISTERED_MODES.append(name)
        if caches_states:
            _REGISTERED_CACHED.append(name)


def check_trunk_model(model: Any) -> None:
    """Check what a trunk mode asks of the rest of ``model``.

    What a trunk mode asks of the rest of ``model`` (a ModelConfig): mode hybrid with no native layers on top
    (n_layers 0) has nothing to add word features to, the heads read the pretrained top blocks directly."""
    trunk = model.trunk
    if trunk.enabled and trunk.mode in HYBRID_MODES and model.n_layers == 0:
        for name in ("char_embedding", "word_features", "word_hash_buckets"):
            if getattr(model, name):
                raise ConfigError(
                    name,
                    "word features are added to the input of the native layers: with model.trunk.mode=hybrid they "
                    "need model.n_layers > 0",
                )
