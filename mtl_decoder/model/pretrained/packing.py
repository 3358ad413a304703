"""Several token sequences packed into one row of the trunk's batch, so that its blocks multiply no padding.

A padded batch of B texts costs B x T tokens in every projection of every block, T being its longest text; with
texts sorted by length the waste is small but not nothing (12% of the trunk's arithmetic on CoNLL-2003 test at the
default token budget: benchmarks/results/pretrained_profile.json). Packed, the texts lie end to end in rows of at
most ``row_tokens`` ids, each text's positions counting from 0 again; Hugging Face's attention masks then give every
token only the tokens of its own text before it (``masking_utils.find_packed_sequence_indices``: a block-diagonal
causal mask, built from the position ids when no attention mask is given). Each text's states are those of the
padded batch up to float rounding (the projections multiply other rows beside them; the masked softmax sums more
exact zeros). The price is attention over the whole row: its cost grows with ``row_tokens``, which is why rows are
kept short (``PACK_TOKENS``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

PACK_TOKENS = 128
"""Default length of a packed row: several CoNLL or SST-2 sentences (15-25 SmolLM2 ids each), and attention over
the row still a few percent of a block's arithmetic. Measured on the 16-block SmolLM2 model, CoNLL-2003 test
sentences, one thread: 1.45x the words per CPU-second of padded batches for requests of 8 texts (padding 42% -> 3%;
benchmarks/results/trunk_packing_calls8.json); level (0.98-1.02x) for 1,000 texts in one call, whose length-sorted
batches pad only 5.5% (trunk_packing.json; 64 and 256 no better)."""

MIN_SAVING = 0.1
"""A batch is packed only where its packed rows hold at least this share fewer ids than the padded batch: below
it, attention over the longer rows costs what the padding saved (the 1,000-text run above), so a length-sorted
batch stays as it is."""


@dataclass(frozen=True)
class PackPlan:
    """Where each text of a batch lies among the packed rows."""

    row: list[int]
    """Per text: the packed row it lies in."""
    start: list[int]
    """Per text: its first position in that row."""
    lengths: list[int]
    row_length: int
    """Length of every packed row (the fullest row's)."""

    @property
    def rows(self) -> int:
        return max(self.row) + 1 if self.row else 0

    @classmethod
    def of(cls, lengths: list[int], row_tokens: int) -> PackPlan:
        """Texts of ``lengths`` spread over as many rows as ``row_tokens`` ids each need for them all, longest first,
        each into the row least filled so far (LPT scheduling): the rows end up about equally full, so padding them
        to the fullest one wastes little (a text longer than the others' rows sets the row length)."""
        import heapq

        rows = max(1, min(len(lengths), -(-sum(lengths) // row_tokens)))  # ceil, and no row left empty
        fill = [(0, r) for r in range(rows)]  # a heap of (ids so far, row)
        row, start = [0] * len(lengths), [0] * len(lengths)
        for i in sorted(range(len(lengths)), key=lambda k: -lengths[k]):
            used, r = heapq.heappop(fill)
            row[i], start[i] = r, used
            heapq.heappush(fill, (used + lengths[i], r))
        fullest = max(used for used, _ in fill) if lengths else 0
        return cls(row, start, list(lengths), fullest)

    def padded_tokens(self) -> int:
        return self.rows * self.row_length

    def pack(self, input_ids: torch.Tensor, pad_id: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        """(B, T) right-padded ids -> (R, L) packed ids and their position ids (each text from 0; a row's unused
        tail a text of its own, of ``pad_id``, whose states are never read)."""
        R, L = self.rows, self.row_length
        ids = input_ids.new_full((R, L), pad_id)
        positions = torch.arange(L, device=input_ids.device).repeat(R, 1)  # (R, L); the tails count on from 0 below
        used = [0] * R
        for i, (r, s, n) in enumerate(zip(self.row, self.start, self.lengths, strict=True)):
            ids[r, s : s + n] = input_ids[i, :n]
            positions[r, s : s + n] = torch.arange(n, device=input_ids.device)
            used[r] = max(used[r], s + n)
        for r, end in enumerate(used):
            positions[r, end:] = torch.arange(L - end, device=input_ids.device)
        return ids, positions

    def unpack(self, packed: torch.Tensor, T: int) -> torch.Tensor:
        """(R, L, H) states of the packed rows -> (B, T, H), each text's at its own positions, zeros after it."""
        B, H = len(self.lengths), packed.shape[-1]
        out = packed.new_zeros(B, T, H)
        for i, (r, s, n) in enumerate(zip(self.row, self.start, self.lengths, strict=True)):
            out[i, :n] = packed[r, s : s + n]
        return out


Forward = Callable[[torch.Tensor, torch.Tensor | None, torch.Tensor | None], torch.Tensor]
"""(ids, attention mask or None, position ids or None) -> states: a trunk's pass (FrozenStates.hidden)."""


def packed_pass(
    forward: Forward,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    row_tokens: int,
    faithful: Callable[[], bool],
) -> torch.Tensor | None:
    """(B, T, H) states of (B, T) right-padded ids from one packed pass of ``forward``, or None where packing is off
    (``row_tokens`` 0), would save less than ``MIN_SAVING`` of the batch's ids, or the trunk does not keep packed
    texts apart (``faithful``, asked only when the rest says pack)."""
    if not row_tokens:
        return None
    plan = PackPlan.of(attention_mask.sum(1).tolist(), row_tokens)
    if plan.padded_tokens() > (1 - MIN_SAVING) * input_ids.numel() or not faithful():
        return None
    ids, positions = plan.pack(input_ids)
    return plan.unpack(forward(ids, None, positions), input_ids.shape[1])


@torch.no_grad()
def packs_faithfully(forward: Forward, vocab_size: int, device: torch.device | str = "cpu") -> bool:
    """Whether ``forward`` keeps packed texts apart: two probe texts packed in one row give the states each gives
    alone. A trunk whose attention does not build the block-diagonal mask from position ids (an architecture whose
    Hugging Face code lacks it) would let the second see the first and count its positions on; such a trunk is run
    padded instead."""
    gen = torch.Generator().manual_seed(0)
    a, b = (torch.randint(1, vocab_size, (n,), generator=gen).to(device) for n in (5, 4))
    plan = PackPlan.of([5, 4], 16)
    ids = torch.zeros(2, 5, dtype=torch.long, device=device)
    ids[0], ids[1, :4] = a, b
    packed, positions = plan.pack(ids)
    together = plan.unpack(forward(packed, None, positions), 5)
    alone = [forward(t.unsqueeze(0), None, None)[0] for t in (a, b)]
    return all(torch.allclose(together[i, : len(t)], alone[i], rtol=1e-3, atol=1e-3) for i, t in enumerate((a, b)))
