"""A distilled student's lexicon: a table of the teacher's, projected to the student's width (``model.lexicon``).

A native student that inherits its teacher's lexicon reads with the teacher's tokenizer (copied into its run
folder, so the saved student needs nothing of the teacher's), and its token-embedding table starts as

    rows     the teacher's token-embedding table (teacher_embeddings), or each vocabulary item of its tokenizer run
             alone through its trunk and its state after block ``layer`` kept, through the trunk's final norm
             (teacher_states: static vectors, as Model2Vec makes them)
    project  centred PCA onto the top d_model principal directions (the SVD of the centred rows, in float64, each
             direction's sign fixed so its largest entry is positive), or the rows as they are (projection none);
             projection learned keeps the centred rows whole and starts a trained projection at those directions
             (model/projected_embedding.py: folded into one table when the student is saved)
    scale    one factor for the whole table, so its entries' root mean square is ``rms``

in the teacher tokenizer's id order. The table is made once per run, before training (``build_lexicon``), and kept
in the run folder (``LEXICON_TABLE``, with ``LEXICON_FILE`` saying what was inherited); at prediction the student
looks its rows up as any native model does. ``resolve_lexicon`` settles the student's config against the teacher
and refuses, in one line naming the key, what cannot work.

A native teacher's table is its weights file's ``embed.weight``; its states come from its own layers (the
stream every route shares: below the first expert layer, PLE's shared route, or hard sharing's one stream; else the
mean of its task routes), without its word features (a vocabulary item alone is no word). A pretrained trunk's
table is read with safetensors from its checkpoint (the teacher folder's trunk/, else the checkpoint trunk.json
names: a folder, or a hub id in the local hub cache); its states come from the checkpoint's first ``layer`` blocks,
loaded and checked against trunk.json's hash by the teacher's own trunk code. Both need the trunk's blocks below the
table frozen: a teacher in mode upcycle (every weight fine-tuned) is refused, and one in mode lora (its blocks
carry trained updates) for teacher_states.
"""

from __future__ import annotations

import dataclasses
import json
import math
import time
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_file
from torch import nn

from mtl_decoder.config import SHARED, ExperimentConfig, LexiconConfig
from mtl_decoder.config.trunk import HYBRID_MODES
from mtl_decoder.data.tokenization import TOKENIZER_FILE, read_tokenizer_file
from mtl_decoder.errors import ConfigError, UserError
from mtl_decoder.hashing import tensors_sha256
from mtl_decoder.model.projected_embedding import ProjectedEmbedding
from mtl_decoder.model.trunks import TRUNK_DIR, TRUNK_FILE, trunk_for
from mtl_decoder.saved import CONFIG_FILE, WEIGHTS_FILE, load_model, read_config

LEXICON_TABLE = "lexicon.safetensors"
"""In the run folder: the table the student's token embedding started from (``table``: vocabulary x d_model)."""
LEXICON_FILE = "lexicon.json"
"""In the run folder: what the student inherited, from which teacher, and how it was projected."""
NATIVE_TABLE = "embed.weight"
"""A native model's token-embedding table in its weights file."""
EMBEDDING_NAMES = ("embed_tokens.weight", "wte.weight", "word_embeddings.weight", "embed_in.weight")
"""The input embedding table of a transformers checkpoint (Llama-style, GPT-2, BERT-style, GPT-NeoX), by the end of
its tensor's name."""
STATES_BATCH = 1024
"""Vocabulary items run through the teacher at once (each a sequence of one token: no padding)."""
FROZEN_TABLE = ("frozen", "echo", "hybrid", "echo_hybrid", "lora")
"""Pretrained modes whose token-embedding table is the checkpoint's, never trained."""
FROZEN_BLOCKS = ("frozen", "echo", "hybrid", "echo_hybrid")
"""Pretrained modes whose lower blocks are the checkpoint's, never trained (hybrid: below its trained top)."""


# ------------------------------------------------------------------------------------------ the config


def resolve_lexicon(config: ExperimentConfig, teacher: Path, teacher_cfg: ExperimentConfig) -> ExperimentConfig:
    """Settle the student's lexicon against its teacher.

    The student's config with the teacher's tokenizer (tokenizer.kind pretrained, its tokenizer.json), the
    teacher's way of reading words (``lexicon.words_as_text``) and the block of teacher_states resolved; the config
    unchanged when ``model.lexicon.source`` is none. A one-line ConfigError naming the key where it cannot work."""
    model = config.model
    lexicon = model.lexicon
    if not lexicon.enabled:
        return config
    mode = teacher_cfg.model.trunk.mode if teacher_cfg.model.trunk.enabled else "native"
    supported = ("native", *(FROZEN_TABLE if lexicon.source == "teacher_embeddings" else FROZEN_BLOCKS))
    if mode not in supported:
        raise ConfigError(
            "model.lexicon.source",
            f"'{lexicon.source}' reads a trunk the teacher never trained, and --teacher {teacher} trains its "
            f"(model.trunk.mode {mode}): use a teacher in mode {', '.join(supported[1:])}, or a native one",
        )
    blocks, width = teacher_shape(teacher, teacher_cfg)
    layer = None
    if lexicon.source == "teacher_states":
        frozen = blocks - teacher_cfg.model.trunk.train_top if mode in HYBRID_MODES else blocks
        layer = lexicon.layer or max(1, min(blocks // 2, frozen))
        if layer > frozen:
            has = f"{blocks} blocks" + (f", the top {blocks - frozen} trained" if frozen < blocks else "")
            raise ConfigError(
                "model.lexicon.layer", f"{layer}: --teacher {teacher} has {has}; choose a block from 1 to {frozen}"
            )
    tokenizer = (teacher / TOKENIZER_FILE).resolve()
    if not tokenizer.is_file():
        raise UserError(f"--teacher {teacher}: no {TOKENIZER_FILE}, which a student that inherits its lexicon reads")
    vocabulary = read_tokenizer_file(tokenizer).get_vocab_size()
    if lexicon.projection == "none" and width != model.d_model:
        raise ConfigError(
            "model.lexicon.projection",
            f"'none' keeps the teacher's rows, {width} wide, and the student's model.d_model is {model.d_model}: "
            f"use pca, or model.d_model={width}",
        )
    if lexicon.projection in ("pca", "learned") and model.d_model > min(width, vocabulary - 1):
        raise ConfigError(
            "model.lexicon.projection",
            f"{lexicon.projection}: the pca of the teacher's {vocabulary} rows, {width} wide, gives at most "
            f"{min(width, vocabulary - 1)} directions, fewer than the student's model.d_model {model.d_model}: "
            "choose a smaller model.d_model",
        )
    asked = config.tokenizer
    if asked.kind == "pretrained" and Path(str(asked.pretrained)).resolve() != tokenizer:
        raise ConfigError(
            "tokenizer.pretrained",
            f"a student with model.lexicon.source={lexicon.source} reads with its teacher's tokenizer (the table's "
            f"rows are its ids), not '{asked.pretrained}': leave tokenizer.kind and tokenizer.pretrained unset",
        )
    lexicon = dataclasses.replace(lexicon, layer=layer, words_as_text=teacher_cfg.model.words_as_text)
    return dataclasses.replace(
        config,
        model=dataclasses.replace(model, lexicon=lexicon),
        tokenizer=dataclasses.replace(asked, kind="pretrained", pretrained=str(tokenizer)),
    )


def teacher_shape(teacher: Path, teacher_cfg: ExperimentConfig) -> tuple[int, int]:
    """(blocks, width) of the teacher's trunk.

    A native one's layers and d_model, a pretrained one's kept blocks and hidden size (trunk.json)."""
    if not teacher_cfg.model.trunk.enabled:
        return teacher_cfg.model.n_layers, teacher_cfg.model.d_model
    identity = _identity(teacher)
    return int(identity["layers"]), int(identity["hidden_size"])


def _identity(teacher: Path) -> dict[str, Any]:
    path = teacher / TRUNK_FILE
    try:
        identity = json.loads(path.read_text(encoding="utf-8"))
        return {**identity, "layers": int(identity["layers"]), "hidden_size": int(identity["hidden_size"])}
    except (OSError, ValueError, KeyError, TypeError) as err:
        reason = f"cannot read the teacher's trunk identity ({err}); copy the whole folder again"
        raise UserError(f"{path}: {reason}") from None


# ------------------------------------------------------------------------------------------ the table


def build_lexicon(
    teacher: Path, config: ExperimentConfig, vocabulary: int, device: torch.device | str = "cpu"
) -> tuple[torch.Tensor, dict[str, Any]]:
    """The student's initial token table and what it records.

    The (vocabulary, d_model) float32 table a student of ``config`` (resolved by ``resolve_lexicon``) starts from,
    row i that of the teacher tokenizer's id i, and the record of how it was made (``LEXICON_FILE``)."""
    lexicon = config.model.lexicon
    teacher_cfg = read_config(teacher / CONFIG_FILE)
    started = time.perf_counter()
    if lexicon.source == "teacher_embeddings":
        rows, origin = teacher_embeddings(teacher, teacher_cfg)
    else:
        rows = teacher_states(teacher, teacher_cfg, int(lexicon.layer or 1), vocabulary, device)
        origin = f"states after block {lexicon.layer} of {teacher_shape(teacher, teacher_cfg)[0]}, final norm"
    if rows.dim() != 2 or rows.shape[0] < vocabulary:
        raise UserError(
            f"--teacher {teacher}: its table ({origin}) has {tuple(rows.shape)} rows, fewer than its tokenizer's "
            f"{vocabulary} tokens: not a table of that tokenizer"
        )
    rows = rows[:vocabulary].double()  # a checkpoint may pad its table past the tokenizer's last id
    tensors, scale, explained = project(rows, config.model.d_model, lexicon.projection, lexicon.rms)
    table = tensors["table"]
    record = {
        "source": lexicon.source,
        "teacher": str(teacher),
        "teacher_fingerprint": config.distill.teacher_hash if config.distill else None,
        "teacher_trunk": teacher_cfg.model.trunk.pretrained or "native",
        "read": origin,
        "layer": lexicon.layer,
        "rows": vocabulary,
        "teacher_width": int(rows.shape[1]),
        "width": config.model.d_model,
        "projection": lexicon.projection,
        "explained_variance": explained,
        "rms": lexicon.rms,
        "scale": scale,
        "freeze_steps": lexicon.freeze_steps,
        "table_sha256": tensors_sha256([("table", table)]),
        "seconds": round(time.perf_counter() - started, 2),
    }
    return tensors, record


def project(
    rows: torch.Tensor, width: int, projection: str, rms: float | None
) -> tuple[dict[str, torch.Tensor], float, float | None]:
    """The teacher's float64 ``rows`` (V, W) brought to the student's ``width``, scaled to root mean square ``rms``.

    The tensors a run folder keeps (``table``: (V, width) float32, the student's first table; with 'learned' also
    ``rows``, the centred rows in float32, kept frozen, and ``projection``, (W, width) the PCA directions scaled,
    whose product is that table), the scale applied, and the share of the variance kept (PCA's; None for 'none')."""
    if projection == "none":
        scale = rms / root_mean_square(rows) if rms else 1.0
        return {"table": (rows * scale).float()}, scale, None
    mean, directions, explained = principal_axes(rows, width)
    centred = rows - mean
    scale = rms / root_mean_square(centred @ directions.T) if rms else 1.0
    weights = directions.T * scale  # (W, width)
    tensors = {"table": (centred @ weights).float()}
    if projection == "learned":
        tensors |= {"rows": centred.float(), "projection": weights.float()}
    return tensors, scale, explained


def principal_axes(rows: torch.Tensor, width: int) -> tuple[torch.Tensor, torch.Tensor, float]:
    """The mean (W,) of float64 ``rows`` (V, W), their top ``width`` principal directions (width, W) and the share
    of the variance those explain.

    The directions are the right singular vectors of the centred rows (torch.linalg.svd), each flipped so that its
    entry of largest magnitude is positive (scikit-learn's convention), so the same rows give the same axes."""
    mean = rows.mean(0, keepdim=True)
    _, singular, directions = torch.linalg.svd(rows - mean, full_matrices=False)
    directions = directions[:width]
    signs = torch.sign(directions.gather(1, directions.abs().argmax(1, keepdim=True)))
    variance = singular.square()
    return mean.squeeze(0), directions * signs, float(variance[:width].sum() / variance.sum())


def take_lexicon(model: nn.Module, tensors: dict[str, torch.Tensor]) -> None:
    """Give a freshly built student its inherited table: copied into ``model.embed``, or with a learned projection
    (``rows`` and ``projection`` among the tensors) ``model.embed`` replaced by a ProjectedEmbedding of them."""
    device = model.embed.weight.device
    if "projection" in tensors:
        model.embed = ProjectedEmbedding(tensors["rows"].to(device), tensors["projection"].to(device))
        return
    with torch.no_grad():
        model.embed.weight.copy_(tensors["table"])


def lexicon_line(record: dict[str, Any], lexicon: LexiconConfig, width: int) -> str:
    """The run log's line on what the student inherited (``record``: the run folder's ``LEXICON_FILE``)."""
    explained = record.get("explained_variance")
    share = f" ({explained:.1%} of the variance)" if isinstance(explained, float) else ""
    steps = lexicon.freeze_steps
    held = ", frozen" if lexicon.frozen else (f", held for {steps} steps" if steps else "")
    return (
        f"lexicon: {record.get('rows', '?')} rows of the teacher's {record.get('read', lexicon.source)}, "
        f"{lexicon.projection} to {width}{share}{held}"
    )


def read_lexicon_table(path: Path) -> dict[str, torch.Tensor]:
    """The tensors ``build_lexicon`` wrote to a run folder's ``LEXICON_TABLE``."""
    try:
        return load_file(str(path))
    except (SafetensorError, OSError) as err:
        reason = (str(err).strip().splitlines() or [type(err).__name__])[0]
        raise UserError(f"{path}: cannot read the student's inherited table ({reason}); start the run over") from None


def root_mean_square(table: torch.Tensor) -> float:
    """The root mean square of the table's entries; a table of zeros is refused (there is nothing to scale)."""
    value = math.sqrt(float(table.square().mean()))
    if not value > 0:
        raise UserError("the teacher's table is all zeros: there is nothing to inherit (model.lexicon.rms)")
    return value


def teacher_embeddings(teacher: Path, teacher_cfg: ExperimentConfig) -> tuple[torch.Tensor, str]:
    """The teacher's token-embedding table, read with safetensors, and where it was read (file:tensor)."""
    if not teacher_cfg.model.trunk.enabled:
        return _read(teacher / WEIGHTS_FILE, NATIVE_TABLE), f"{teacher / WEIGHTS_FILE}:{NATIVE_TABLE}"
    for folder in _checkpoint_folders(teacher):
        for path in sorted(folder.glob("*.safetensors")):
            try:
                with safe_open(str(path), "pt") as f:
                    name = embedding_name(list(f.keys()))
                    if name is not None:
                        return f.get_tensor(name), f"{path}:{name}"
            except (SafetensorError, OSError) as err:
                raise UserError(f"{path}: not a readable safetensors file ({err})") from None
    raise UserError(
        f"--teacher {teacher}: no input embedding table ({', '.join(EMBEDDING_NAMES)}) in the safetensors files of "
        f"its trunk's checkpoint ({_identity(teacher).get('source')}) (model.lexicon.source)"
    )


def embedding_name(names: list[str]) -> str | None:
    """The input embedding table among a checkpoint's tensor names (the shortest of the first kind found)."""
    for end in EMBEDDING_NAMES:
        found = [n for n in names if n == end or n.endswith("." + end)]
        if found:
            return min(found, key=len)
    return None


def _read(path: Path, name: str) -> torch.Tensor:
    try:
        with safe_open(str(path), "pt") as f:
            return f.get_tensor(name)
    except (SafetensorError, OSError) as err:
        raise UserError(f"{path}: cannot read {name} ({err}); copy the teacher folder again") from None


def _checkpoint_folders(teacher: Path):
    """The folders that may hold the teacher trunk's safetensors, in order.

    The teacher's trunk/ (model.trunk.save full), then the checkpoint trunk.json names (a folder; a hub id: its
    snapshot in the local hub cache)."""
    yield teacher / TRUNK_DIR
    identity = _identity(teacher)
    source = str(identity.get("source"))
    path = Path(source).expanduser()
    if path.suffix.lower() == ".gguf":
        raise UserError(
            f"--teacher {teacher}: its trunk is a GGUF file ({source}), which safetensors cannot read; save the "
            "teacher with model.trunk.save=full, or use model.lexicon.source=teacher_states"
        )
    if path.is_dir():
        yield path
        return
    from huggingface_hub import snapshot_download  # a hub id: only then

    try:
        yield Path(snapshot_download(source, revision=identity.get("revision"), allow_patterns=["*.safetensors"]))
    except Exception as err:  # huggingface_hub raises many kinds: offline, gated, not found
        reason = (str(err).strip().splitlines() or [type(err).__name__])[0]
        raise UserError(f"--teacher {teacher}: cannot reach its trunk's checkpoint '{source}' ({reason})") from None


# ------------------------------------------------------------------------------------------ static vectors


@torch.inference_mode()
def teacher_states(
    teacher: Path, teacher_cfg: ExperimentConfig, layer: int, vocabulary: int, device: torch.device | str = "cpu"
) -> torch.Tensor:
    """Static vectors: each token id of the teacher's vocabulary run alone through its first ``layer`` blocks.

    (vocabulary, width) float32, each row the token's state through the trunk's final norm (see the module doc for
    which stream and which blocks)."""
    device = torch.device(device)
    if teacher_cfg.model.trunk.enabled:
        run = _pretrained_blocks(teacher, teacher_cfg, layer, device)
    else:
        run = _native_blocks(teacher, layer, device)
    out = []
    with torch.autocast(device.type, enabled=False):
        for start in range(0, vocabulary, STATES_BATCH):
            ids = torch.arange(start, min(vocabulary, start + STATES_BATCH), device=device).unsqueeze(1)  # (n, 1)
            out.append(run(ids).float().cpu())
    return torch.cat(out)


def _native_blocks(teacher: Path, layer: int, device: torch.device):
    """A native teacher's first ``layer`` blocks as a function of (n, 1) ids."""
    model = load_model(teacher, device=device).model
    model.layers = nn.ModuleList(list(model.layers)[:layer])  # the blocks above are never run
    model.word_features = None  # a vocabulary item alone is no word
    forked = model.fork_layer < layer

    def run(ids: torch.Tensor) -> torch.Tensor:
        mask = torch.ones_like(ids, dtype=torch.bool)
        layout = model.route_layout(mask, model.task_names, None)
        h, _ = model.encode(ids, mask, layout, {})  # (rows, 1, C)
        if forked:  # one row per (example, route): the shared route's, else the mean of the task routes'
            routes = [layout.names.index(SHARED)] if SHARED in layout.names else range(len(layout.names))
            h = torch.stack([h[slice(*layout.row_bounds[r])] for r in routes]).mean(0)
        return model.final_norm(h[:, 0])

    return run


def _pretrained_blocks(teacher: Path, teacher_cfg: ExperimentConfig, layer: int, device: torch.device):
    """A pretrained teacher's checkpoint cut to its first ``layer`` blocks as a function of (n, 1) ids."""
    from mtl_decoder.model.pretrained.hub import keep_first_layers  # transformers only for a pretrained teacher

    saved_trunk = teacher / TRUNK_DIR
    base, _ = trunk_for(teacher_cfg.model).load_base(saved_trunk if saved_trunk.is_dir() else None, _identity(teacher))
    keep_first_layers(base, layer)
    base.to(device).eval()

    def run(ids: torch.Tensor) -> torch.Tensor:
        return base(input_ids=ids, attention_mask=torch.ones_like(ids), use_cache=False).last_hidden_state[:, 0]

    return run
