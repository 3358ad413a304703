"""A linear-chain CRF over word positions, with IOB2's impossible transitions forbidden."""

from __future__ import annotations

import torch
from torch import nn

FORBIDDEN = -1e4


def iob2_allowed(labels: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
    """(start_ok (L,), transition_ok (L, L)): I-X may only start after B-X or I-X."""
    L = len(labels)
    start_ok = torch.tensor([not lab.startswith("I-") for lab in labels])
    trans_ok = torch.ones(L, L, dtype=torch.bool)
    for j, lab in enumerate(labels):
        if lab.startswith("I-"):
            kind = lab[2:]
            for i, prev in enumerate(labels):
                trans_ok[i, j] = prev in (f"B-{kind}", f"I-{kind}")
    return start_ok, trans_ok


class CRF(nn.Module):
    def __init__(self, labels: list[str]):
        super().__init__()
        L = len(labels)
        self.transitions = nn.Parameter(torch.zeros(L, L))  # [from, to]
        self.start = nn.Parameter(torch.zeros(L))
        self.end = nn.Parameter(torch.zeros(L))
        start_ok, trans_ok = iob2_allowed(labels)
        self.register_buffer("start_penalty", torch.where(start_ok, 0.0, FORBIDDEN), persistent=False)
        self.register_buffer("trans_penalty", torch.where(trans_ok, 0.0, FORBIDDEN), persistent=False)

    def _scores(self) -> tuple[torch.Tensor, torch.Tensor]:
        return self.start + self.start_penalty, self.transitions + self.trans_penalty

    def nll(self, emissions: torch.Tensor, tags: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """Negative log-likelihood per sequence. emissions (n, W, L); tags, mask (n, W); masks are prefixes."""
        emissions = emissions.float()
        start, trans = self._scores()
        tags = tags.clamp(min=0)
        _n, W, _ = emissions.shape
        lengths = mask.sum(1)  # (n,)
        emitted = emissions.gather(2, tags.unsqueeze(-1)).squeeze(-1)  # (n, W)
        moves = trans[tags[:, :-1], tags[:, 1:]]  # (n, W-1)
        gold = start[tags[:, 0]] + (emitted * mask).sum(1) + (moves * mask[:, 1:]).sum(1)
        gold = gold + self.end[tags.gather(1, (lengths - 1).clamp(min=0).unsqueeze(1)).squeeze(1)]
        alpha = start + emissions[:, 0]  # (n, L)
        for w in range(1, W):
            step = torch.logsumexp(alpha.unsqueeze(2) + trans + emissions[:, w].unsqueeze(1), dim=1)
            alpha = torch.where(mask[:, w].unsqueeze(1), step, alpha)
        return torch.logsumexp(alpha + self.end, dim=1) - gold

    @torch.no_grad()
    def decode(
        self, emissions: torch.Tensor, mask: torch.Tensor, after: torch.Tensor | None = None, end: bool = True
    ) -> list[list[int]]:
        """Viterbi decoding of every row at once.

        Viterbi: the best tag sequence of each (prefix-masked) sequence, all rows at once. emissions (n, W, L);
        mask (n, W). ``after`` (n,): the tag each row continues from (its transition scores replace the start
        scores; -1: the row starts a sequence); ``end`` False leaves out the end scores (a sequence that goes on)."""
        emissions = emissions.float()
        start, trans = self._scores()
        n, W, L = emissions.shape
        identity = torch.arange(L, device=emissions.device).expand(n, L)
        if after is not None:
            start = torch.where((after >= 0).unsqueeze(1), trans[after.clamp(min=0)], start)
        score = start + emissions[:, 0]  # (n, L)
        history = []  # step w: the best tag at w-1 for each tag at w (identity past a row's end)
        for w in range(1, W):
            best, idx = (score.unsqueeze(2) + trans).max(dim=1)  # (n, L)
            keep = mask[:, w].unsqueeze(1)
            score = torch.where(keep, best + emissions[:, w], score)
            history.append(torch.where(keep, idx, identity))
        tag = (score + self.end if end else score).argmax(dim=1)  # (n,): every row's last tag (constant past its end)
        tags = [tag]
        for idx in reversed(history):
            tag = idx.gather(1, tag.unsqueeze(1)).squeeze(1)
            tags.append(tag)
        paths = torch.stack(tags[::-1], dim=1).tolist()  # (n, W)
        return [path[:length] for path, length in zip(paths, mask.sum(1).tolist(), strict=True)]

    def marginals(self, emissions: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """Forward-backward tag marginals under the CRF.

        Forward-backward: (n, W, L) probability of each tag at each word under the CRF, summing to 1 over tags
        at every real word and 0 past a row's end. emissions (n, W, L); mask (n, W), prefixes. Differentiable."""
        emissions = emissions.float()
        start, trans = self._scores()
        W = emissions.shape[1]
        alphas = [start + emissions[:, 0]]  # alphas[w] (n, L): log-sum of the paths ending in each tag at w
        for w in range(1, W):
            step = torch.logsumexp(alphas[-1].unsqueeze(2) + trans + emissions[:, w].unsqueeze(1), dim=1)
            alphas.append(torch.where(mask[:, w].unsqueeze(1), step, alphas[-1]))
        betas = [self.end.expand_as(alphas[0])]  # betas[w] (n, L): log-sum of the paths from each tag at w on
        for w in range(W - 2, -1, -1):
            step = torch.logsumexp(trans + (emissions[:, w + 1] + betas[0]).unsqueeze(1), dim=2)
            betas.insert(0, torch.where(mask[:, w + 1].unsqueeze(1), step, self.end.expand_as(step)))
        log_z = torch.logsumexp(alphas[-1] + self.end, dim=1)  # (n,)
        log_p = torch.stack(alphas, 1) + torch.stack(betas, 1) - log_z[:, None, None]  # (n, W, L)
        return log_p.exp() * mask.unsqueeze(2)
