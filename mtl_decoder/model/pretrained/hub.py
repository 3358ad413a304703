"""A pretrained Hugging Face causal LM as a trunk.

Loaded through transformers' own classes from the hub, a local
folder or a GGUF file, cut to its first N blocks, with its identity (where it came from and a hash of its weights)
and its tokenizer. transformers is imported inside the functions: a native model never pays for it."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from mtl_decoder.config import TrunkConfig
from mtl_decoder.errors import UserError
from mtl_decoder.hashing import tensors_sha256

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass
class BaseIdentity:
    """What a saved model records of its pretrained trunk, and checks when loaded."""

    source: str
    """The hub id, folder or .gguf file it was loaded from."""
    revision: str | None
    architecture: str
    """transformers' model_type (llama, qwen2, gpt2, ...)."""
    layers: int
    """Blocks kept."""
    hidden_size: int
    sha256: str
    """Hash of the kept weights (float32 bytes in parameter order): the same whatever file or dtype held them."""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def decoder_layers(model: nn.Module) -> nn.ModuleList:
    """The list of transformer blocks of a transformers base model (Llama-style ``layers``, GPT-2 ``h``)."""
    for name in ("layers", "h", "blocks"):
        layers = getattr(model, name, None)
        if isinstance(layers, nn.ModuleList):
            return layers
    raise UserError(f"{type(model).__name__}: cannot find its list of decoder blocks (supported: Llama-style, GPT-2)")


def keep_first_layers(model: nn.Module, n: int | None) -> int:
    """Drop every block after the first ``n`` (in place, the config updated to match); returns the count kept."""
    layers = decoder_layers(model)
    if n is None or n >= len(layers):
        return len(layers)
    for name in ("layers", "h", "blocks"):
        if getattr(model, name, None) is layers:
            setattr(model, name, nn.ModuleList(list(layers)[:n]))
    config = model.config
    for key in ("num_hidden_layers", "n_layer"):
        if hasattr(config, key):
            setattr(config, key, n)
    if isinstance(getattr(config, "layer_types", None), list):  # per-layer attention kinds (Qwen2, Gemma, ...)
        config.layer_types = config.layer_types[:n]
    return n


def _split_source(source: str) -> tuple[str, str | None]:
    """(folder or hub id, gguf file name or None)."""
    path = Path(source).expanduser()
    if path.suffix.lower() == ".gguf":
        if not path.is_file():
            raise UserError(f"model.trunk.pretrained: {path}: no such GGUF file")
        return str(path.parent), path.name
    return (str(path) if path.exists() else source), None


def load_causal_lm(source: str, revision: str | None, dtype: str) -> nn.Module:
    """The whole causal LM (LM head included) from a hub id, a folder or a .gguf file; a UserError if it cannot."""
    from transformers import AutoModelForCausalLM

    where, gguf = _split_source(source)
    kwargs: dict[str, Any] = {"dtype": DTYPES[dtype], "revision": revision}
    if gguf is not None:
        kwargs["gguf_file"] = gguf
    try:
        return AutoModelForCausalLM.from_pretrained(where, attn_implementation="sdpa", **kwargs)
    except (OSError, ValueError, KeyError) as err:
        raise UserError(f"model.trunk.pretrained: cannot load '{source}' ({str(err).splitlines()[0]})") from None


def load_base(trunk: TrunkConfig) -> tuple[nn.Module, BaseIdentity]:
    """The base model (no LM head) with its first ``trunk.layers`` blocks, in eval mode, and its identity."""
    lm = load_causal_lm(str(trunk.pretrained), trunk.revision, trunk.dtype)
    base = lm.base_model
    kept = keep_first_layers(base, trunk.layers)
    base.eval()
    identity = BaseIdentity(
        source=str(trunk.pretrained),
        revision=trunk.revision,
        architecture=str(base.config.model_type),
        layers=kept,
        hidden_size=int(base.config.hidden_size),
        sha256=tensors_sha256(base.state_dict().items()),
    )
    return base, identity


def base_from_config(directory: Path, identity: dict[str, Any], dtype: str) -> tuple[nn.Module, BaseIdentity]:
    """A trunk of the saved architecture with untrained weights.

    A trunk of the saved architecture (``directory``/config.json) with untrained weights, for a model folder
    whose weights file holds every trunk weight (mode upcycle): the original checkpoint is not needed."""
    from transformers import AutoConfig, AutoModel

    config = AutoConfig.from_pretrained(str(directory))
    base = AutoModel.from_config(config, attn_implementation="sdpa", dtype=DTYPES[dtype])
    base.eval()
    return base, BaseIdentity(**identity)


def load_tokenizer(trunk: TrunkConfig):
    """The checkpoint's own tokenizer, as a ``tokenizers.Tokenizer`` (its fast backend)."""
    from transformers import AutoTokenizer

    where, gguf = _split_source(trunk.pretrained)
    kwargs: dict[str, Any] = {"revision": trunk.revision}
    if gguf is not None:
        kwargs["gguf_file"] = gguf
    try:
        tok = AutoTokenizer.from_pretrained(where, **kwargs)
    except (OSError, ValueError, KeyError) as err:
        raise UserError(f"model.trunk.pretrained: no tokenizer for '{trunk.pretrained}' ({err})") from None
    if not getattr(tok, "is_fast", False):
        raise UserError(f"model.trunk.pretrained: '{trunk.pretrained}' has no fast (tokenizers) tokenizer")
    return tok.backend_tokenizer


def max_positions(model: nn.Module) -> int | None:
    config = model.config
    for key in ("max_position_embeddings", "n_positions"):
        value = getattr(config, key, None)
        if isinstance(value, int):
            return value
    return None
