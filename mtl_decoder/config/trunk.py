"""``model.trunk``: a pretrained Hugging Face causal LM as the trunk, and how it is trained and saved."""

from __future__ import annotations

from dataclasses import dataclass

from mtl_decoder.config.checks import check_choice, check_positive

TRUNK_MODES = ("upcycle", "lora", "frozen")
TRUNK_DTYPES = ("float32", "bfloat16", "float16")


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
    ``layers`` computed once per text and cached on disk, native PLE layers (model.n_layers) trained on top."""
    layers: int | None = None
    """Keep the first N pretrained blocks (None: all)."""
    dtype: str = "float32"
    """Weights of the pretrained trunk: 'float32', 'bfloat16' or 'float16' (the last two for GPUs)."""
    lora_rank: int = 8
    """Rank of each expert's low-rank update (mode 'lora')."""
    lora_alpha: float = 16.0
    """LoRA scaling numerator: updates are scaled by lora_alpha / lora_rank."""
    lora_attention: bool = False
    """Mode 'lora': also put one low-rank update on the attention projections (shared by all routes)."""
    cache_dir: str | None = None
    """Mode 'frozen': where hidden states are cached (default ~/.cache/mtl-decoder/states); keyed by the base
    model's weights hash, the layer and the token ids, so runs can share it."""
    save: str = "reference"
    """What best/ stores of a frozen or LoRA trunk: 'reference' (its id or path and a hash of its weights, checked
    on load) or 'full' (the pretrained weights too, so the folder stands alone)."""
    gradient_checkpointing: bool = False
    """Recompute the trunk's activations in the backward pass (modes 'upcycle' and 'lora'): less memory, ~30% more
    compute; for large trunks."""

    def __post_init__(self) -> None:
        check_choice("mode", self.mode, TRUNK_MODES)
        check_choice("dtype", self.dtype, TRUNK_DTYPES)
        check_choice("save", self.save, ("reference", "full"))
        if self.layers is not None:
            check_positive("layers", self.layers)
        check_positive("lora_rank", self.lora_rank)
        check_positive("lora_alpha", self.lora_alpha)

    @property
    def enabled(self) -> bool:
        return self.pretrained is not None
