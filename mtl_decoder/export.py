"""A saved model's pretrained trunk as a standard Hugging Face checkpoint:

    mtl-decoder export --model RUN/best --trunk --output DIR [--expert shared/0] [--force]

writes DIR with config.json, generation_config.json, model.safetensors (a causal LM: the trunk and an LM head) and
the tokenizer files, which ``AutoModelForCausalLM.from_pretrained(DIR)`` loads with no mtl-decoder installed, and the
marker ``.mtl-decoder-export``: ``--force`` replaces only such a folder (an earlier export), never another one.

What "the trunk" is, per mode (model.trunk.mode):

- ``frozen``: the pretrained blocks kept, unchanged (the PLE layers trained on top of them are not part of it).
- ``lora``: the pretrained weights with the chosen expert's low-rank update merged into every block's MLP, and the
  attention update (model.trunk.lora_attention) merged into the attention projections.
- ``upcycle``: every block's attention and norms as trained, and the chosen expert's MLP.

Task experts and gates have no place in a standard checkpoint, whose blocks each hold one MLP: the export gives
every block the MLP of one expert (``--expert``: ``shared/0``, the first shared expert, by default; ``TASK/i`` for
a task's own), i.e. it computes the path of the model whose gates all put their whole weight on that expert. The
hidden states of the exported model are the trunk's on that path; with model.attention bidirectional the config
says ``is_causal: false``, so the exported model attends as it was trained (generation then makes little sense).

The LM head: tied to the (exported) embeddings when the base model ties them (SmolLM2, Qwen2.5-0.5B, the GGUF
files without an output tensor); otherwise the original model's head, read from model.trunk.pretrained (a hub id,
folder or .gguf file) after checking that it still is the trunk the model was trained on. When it is not available
(or no longer the same), the head is tied to the embeddings and the result says so: the hidden states are still
the trunk's, the next-token predictions are not the original model's.
"""

from __future__ import annotations

import copy
import json
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from torch import nn

from mtl_decoder.config import SHARED, ExperimentConfig
from mtl_decoder.errors import UserError
from mtl_decoder.files import (
    WriteFailed,
    atomic_write_json,
    atomic_write_safetensors,
    atomic_write_text,
    check_writable_parent,
    replace_dir,
    temporary_sibling,
)
from mtl_decoder.hashing import tensors_sha256
from mtl_decoder.model.trunks import trunk_for
from mtl_decoder.paths import check_outside_model
from mtl_decoder.saved import load_model
from mtl_decoder.termination import shielded

DEFAULT_EXPERT = f"{SHARED}/0"
README = "README.md"
MARKER = ".mtl-decoder-export"
"""Written into every export: ``--force`` replaces only a folder that holds it."""


@dataclass
class ExportResult:
    directory: Path
    mode: str
    expert: str | None
    """The expert whose path was exported (None: mode frozen, or hard sharing with one MLP per block)."""
    lm_head: str
    """'tied' (to the exported embeddings) or 'original' (the base model's own head)."""
    notes: list[str] = field(default_factory=list)

    def report(self) -> str:
        path = f", expert {self.expert}" if self.expert else ""
        lines = [f"wrote {self.directory} (mode {self.mode}{path}, LM head {self.lm_head})"]
        return "\n".join(lines + [f"note: {n}" for n in self.notes])


def export_trunk(
    model_dir: str | Path, output: str | Path, expert: str | None = None, force: bool = False
) -> ExportResult:
    """Export a saved model's trunk as a transformers checkpoint.

    Write the trunk of the saved model ``model_dir`` (on the path of ``expert``, default ``shared/0``) to
    ``output`` as a transformers causal-LM checkpoint; an existing ``output`` is replaced only with ``force``."""
    output = Path(output)
    replaced = check_export_output(output, model_dir, force)
    saved = load_model(model_dir, device="cpu")
    config, model = saved.config, saved.model
    trunk = config.model.trunk
    reading = model.trunk_kind
    base, has_experts = reading.export_base(Path(model_dir), expert)
    notes: list[str] = []
    if not has_experts:
        state = {k: v.detach() for k, v in base.state_dict().items()}
        chosen = None
        notes.append("mode frozen: the pretrained trunk unchanged; the PLE layers trained on top are not exported")
    else:
        chosen, state = _expert_path_state(base, expert, config)
    hf_config = copy.deepcopy(base.config)
    if reading.attention_reaches_trunk and config.model.attention == "bidirectional":
        hf_config.is_causal = False
        notes.append("trained with bidirectional attention: config.json says is_causal false, as the trunk computed")
    head, head_note = _lm_head(hf_config, saved.directory, trunk.dtype)
    if head_note:
        notes.append(head_note)

    tmp = temporary_sibling(output)
    tmp.mkdir(parents=True)
    try:
        _write_checkpoint(tmp, hf_config, state, head)
        _write_tokenizer(tmp, saved.directory, hf_config)
        atomic_write_text(tmp / README, _card(saved.directory, config, chosen, head is not None, notes))
        atomic_write_json(tmp / MARKER, {"created_by": "mtl-decoder export", "model": str(model_dir)})
        replace_dir(tmp, output)  # an old folder (--force) is replaced only once the new one is complete
    except (OSError, SafetensorError, WriteFailed) as err:  # a full disk
        reason = err.reason if isinstance(err, WriteFailed) else (str(err).strip().splitlines() or [""])[0]
        raise UserError(
            f"{output}: cannot write the export ({reason}); its temporary folder was removed, {output} is as it was"
        ) from None
    finally:
        with shielded():
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)
    if replaced:  # said after the README was written: it describes the export, not this replacement
        notes.append(f"--force replaced the earlier export in {output}, removing: {', '.join(replaced)}")
    return ExportResult(output, trunk.mode, chosen, "original" if head is not None else "tied", notes)


def check_export_output(output: Path, model_dir: str | Path, force: bool) -> list[str]:
    """Checks before any work; returns the names an earlier export's folder holds, which --force replaces."""
    check_outside_model(output, model_dir, replaces=True)  # --force replaces the folder whole
    found: list[str] = []
    if output.exists():
        if not output.is_dir():
            raise UserError(f"--output {output}: a file is in the way; choose another folder")
        found = sorted(p.name + ("/" if p.is_dir() else "") for p in output.iterdir())
        if found and not force:
            raise UserError(f"--output {output}: the folder is not empty; add --force to replace it")
        if found and not _is_export(output):
            names = ", ".join(found[:5]) + (", ..." if len(found) > 5 else "")
            raise UserError(
                f"--output {output}: is not empty and is not an export of mtl-decoder ({names}); --force replaces "
                "only an earlier export: choose an empty or new --output"
            )
    check_writable_parent(output, "--output")
    return found


def _is_export(folder: Path) -> bool:
    """A folder an earlier export wrote: it has the marker (or, written before the marker, this module's README)."""
    if (folder / MARKER).is_file():
        return True
    try:
        first = (folder / README).read_text(encoding="utf-8").split("\n", 1)[0]
    except (OSError, UnicodeDecodeError):
        return False
    return first.startswith("# Trunk exported from ") and first.endswith(" (mtl-decoder)")


# --------------------------------------------------------------------------------------------- the expert's path


def _expert_path_state(base: nn.Module, expert: str | None, config: ExperimentConfig) -> tuple[str | None, dict]:
    """The base model's state dict along one expert's path.

    The base model's state dict under its original names, each block's MLP that of ``expert`` and every LoRA
    update merged into its weight (``get_delta_weight``: the frozen weights shared by the experts stay as they are)."""
    from mtl_decoder.model.pretrained.adapters import RoutedMLP, SingleExpertMLP

    routed = [m for m in base.modules() if isinstance(m, RoutedMLP)]
    if routed:
        name = expert or DEFAULT_EXPERT
        _expert_module(routed[0].block, name, config)  # a clear error for a name that is not an expert
    else:  # hard sharing: one MLP per block
        if expert not in (None, DEFAULT_EXPERT):
            raise UserError(
                f"--expert {expert}: model.ffn {config.model.ffn} has one MLP per block and no experts; "
                "leave --expert out"
            )
        name = None
    state: dict[str, torch.Tensor] = {}

    def visit(module: nn.Module, prefix: str) -> None:
        if isinstance(module, RoutedMLP):
            module = _expert_module(module.block, name, config)
        elif isinstance(module, SingleExpertMLP):
            module = module.expert
        if _is_lora(module):
            state.update(_merged_lora(module, prefix))
            return
        for key, p in module._parameters.items():
            if p is not None:
                state[prefix + key] = p.detach()
        for key, b in module._buffers.items():
            if b is not None and key not in module._non_persistent_buffers_set:
                state[prefix + key] = b.detach()
        for key, child in module._modules.items():
            if child is not None:
                visit(child, f"{prefix}{key}.")

    visit(base, "")
    return name, state


def _expert_module(block: nn.Module, name: str, config: ExperimentConfig) -> nn.Module:
    """The MLP of expert ``name`` ('shared/i' or 'TASK/i') of an expert block."""
    group_name, _, index = name.partition("/")
    groups = {SHARED: block.shared, **block.task_experts}
    group = groups.get(group_name)
    if group is None or not index.isdigit() or int(index) >= len(group.experts):
        names = [f"{g}/{i}" for g, experts in groups.items() for i in range(len(experts.experts))]
        raise UserError(
            f"--expert {name}: not an expert of this model (model.ffn {config.model.ffn}): {', '.join(names)}"
        )
    return group.experts[int(index)]


def _is_lora(module: nn.Module) -> bool:
    try:
        from peft.tuners.lora.layer import LoraLayer
    except ImportError:
        return False
    return isinstance(module, LoraLayer)


def _merged_lora(module: nn.Module, prefix: str) -> dict[str, torch.Tensor]:
    """A peft LoRA layer's base parameters with its updates merged.

    A peft LoRA layer's base parameters under the base layer's own names, its updates added to the weight (in
    the base layer's layout: (out, in) for nn.Linear, (in, out) for GPT-2's Conv1D)."""
    base = module.get_base_layer()
    out = {prefix + k: v.detach() for k, v in base.state_dict().items()}
    weight = base.weight.detach()
    delta = sum(module.get_delta_weight(adapter).float() for adapter in module.lora_A)
    out[prefix + "weight"] = (weight.float() + delta).to(weight.dtype)
    return out


# --------------------------------------------------------------------------------------------- the LM head


def _lm_head(hf_config: Any, model_dir: Path, dtype: str) -> tuple[torch.Tensor | None, str | None]:
    """The original untied LM head (None: tied to the embeddings), and a note when the head had to be tied."""
    if getattr(hf_config, "tie_word_embeddings", True):
        return None, None
    identity = json.loads((model_dir / "trunk.json").read_text(encoding="utf-8"))
    source = identity.get("source")
    from mtl_decoder.model.pretrained.hub import keep_first_layers, load_causal_lm

    reason = None
    try:
        lm = load_causal_lm(str(source), identity.get("revision"), dtype)
    except UserError as err:
        lm, reason = None, f"cannot load it ({err})"
    if lm is not None:
        keep_first_layers(lm.base_model, identity.get("layers"))
        if tensors_sha256(lm.base_model.state_dict().items()) != identity.get("sha256"):
            lm, reason = None, "it is no longer the checkpoint the model was trained on (weights hash differs)"
    if lm is None:
        hf_config.tie_word_embeddings = True
        return None, (
            f"the base model's LM head is its own (not tied), and {source}: {reason}; the exported head is tied "
            "to the embeddings: hidden states are the trunk's, next-token predictions are not the original model's"
        )
    return lm.get_output_embeddings().weight.detach(), None


# --------------------------------------------------------------------------------------------- writing


def _write_checkpoint(folder: Path, hf_config: Any, state: dict[str, torch.Tensor], head: torch.Tensor | None) -> None:
    from transformers import AutoModelForCausalLM, GenerationConfig

    if hasattr(hf_config, "quantization_config"):  # loaded from a GGUF file: the weights written are plain
        del hf_config.quantization_config
    with torch.device("meta"):  # the causal-LM class only for its names (no memory)
        lm = AutoModelForCausalLM.from_config(hf_config)
    prefix = lm.base_model_prefix
    head_name = next(n for n, m in lm.named_modules() if m is lm.get_output_embeddings())
    expected = {k for k in lm.state_dict() if k.startswith(prefix + ".")}
    tensors = {f"{prefix}.{k}": v.contiguous().cpu() for k, v in state.items()}
    if head is not None:
        tensors[f"{head_name}.weight"] = head.contiguous().cpu()
    missing = sorted(expected - tensors.keys())
    if missing:  # a bug, not a user error: the trunk's names must be the base model's
        raise RuntimeError(f"export: the trunk's weights lack {', '.join(missing[:3])}")
    dtypes = {v.dtype for v in tensors.values() if v.is_floating_point()}
    if len(dtypes) == 1:
        hf_config.dtype = dtypes.pop()
    hf_config.architectures = [type(lm).__name__]
    hf_config.save_pretrained(str(folder))
    GenerationConfig.from_model_config(hf_config).save_pretrained(str(folder))
    atomic_write_safetensors(folder / "model.safetensors", tensors, metadata={"format": "pt"})


def _write_tokenizer(folder: Path, model_dir: Path, hf_config: Any) -> None:
    """Write the saved model's tokenizer as transformers' fast tokenizer files.

    The tokenizer of the saved model (its tokenizer.json, the checkpoint's own), with the special tokens the
    model's config names, as transformers' fast tokenizer files."""
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer.from_file(str(model_dir / "tokenizer.json"))

    def token(key: str) -> str | None:
        value = getattr(hf_config, key, None)
        if isinstance(value, list):
            value = value[0] if value else None
        return tok.id_to_token(value) if isinstance(value, int) else None

    specials = {k: token(f"{k}_id") for k in ("bos_token", "eos_token", "pad_token")}
    unk = getattr(tok.model, "unk_token", None)
    if unk is not None and tok.token_to_id(unk) is not None:
        specials["unk_token"] = unk
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, **{k: v for k, v in specials.items() if v is not None})
    length = next(
        (getattr(hf_config, k) for k in ("max_position_embeddings", "n_positions") if hasattr(hf_config, k)), None
    )
    if isinstance(length, int):
        fast.model_max_length = length
    fast.save_pretrained(str(folder))


def _card(model_dir: Path, config: ExperimentConfig, expert: str | None, own_head: bool, notes: list[str]) -> str:
    """A short README for the exported checkpoint: where it comes from and what it computes."""
    identity = json.loads((model_dir / "trunk.json").read_text(encoding="utf-8"))
    trunk = config.model.trunk
    what = trunk_for(config.model).export_summary
    lines = [
        f"# Trunk exported from {model_dir.name} (mtl-decoder)",
        "",
        f"A standard Hugging Face causal-LM checkpoint of the trunk of the multi-task model `{model_dir}`: {what}.",
        "",
        f"- base model: `{identity.get('source')}`"
        + (f" (revision {identity['revision']})" if identity.get("revision") else ""),
        f"- architecture {identity.get('architecture')}, first {identity.get('layers')} blocks, hidden size "
        f"{identity.get('hidden_size')}; base weights sha256 `{identity.get('sha256')}`",
        f"- model.trunk.mode {trunk.mode}, model.ffn {config.model.ffn}, model.attention {config.model.attention}",
        "- each block's MLP: " + (f"expert `{expert}`" if expert else "the block's only MLP"),
        "- LM head: " + ("the base model's own" if own_head else "tied to the embeddings"),
        "",
        "Task experts, gates and task heads have no place in a standard checkpoint: the blocks hold the MLP of one",
        "expert, so this model computes the path of the multi-task model whose gates all choose that expert.",
        "It is not a replacement for the multi-task model (use `mtl-decoder predict` with it for the tasks).",
    ]
    if notes:
        lines += ["", "Notes:", ""] + [f"- {n}" for n in notes]
    return "\n".join(lines) + "\n"
