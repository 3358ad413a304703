"""The CRF against brute force over every tag sequence, and IOB2's forbidden transitions."""

import itertools

import torch

from mtl_decoder.model.crf import CRF, iob2_allowed

LABELS = ["O", "B-PER", "I-PER"]


def random_crf(labels, seed: int) -> CRF:
    torch.manual_seed(seed)
    crf = CRF(labels)
    with torch.no_grad():
        for p in crf.parameters():
            p.normal_(0, 1.0)
    return crf


def path_score(crf: CRF, labels: list[str], emissions: torch.Tensor, tags: tuple[int, ...]) -> torch.Tensor:
    """Score of one sequence (emissions (W, L)), impossible IOB2 moves penalised as the CRF documents."""
    start_ok, trans_ok = iob2_allowed(labels)
    penalty = -1e4
    s = crf.start[tags[0]] + (0.0 if start_ok[tags[0]] else penalty) + emissions[0, tags[0]]
    for prev, cur, w in zip(tags, tags[1:], range(1, len(tags)), strict=False):
        s = s + crf.transitions[prev, cur] + (0.0 if trans_ok[prev, cur] else penalty) + emissions[w, cur]
    return s + crf.end[tags[-1]]


def test_nll_equals_brute_force_log_partition():
    crf = random_crf(LABELS, 0)
    L, W = 3, 3
    gen = torch.Generator().manual_seed(1)
    emissions = torch.randn(3, W, L, generator=gen)
    mask = torch.tensor([[1, 1, 1], [1, 1, 0], [1, 0, 0]], dtype=torch.bool)
    tags = torch.tensor([[1, 2, 0], [0, 1, -100], [2, -100, -100]])  # row 2 starts with I-: a forbidden path
    nll = crf.nll(emissions, tags, mask)
    for i in range(3):
        n = int(mask[i].sum())
        em = emissions[i, :n]
        log_z = torch.logsumexp(
            torch.stack([path_score(crf, LABELS, em, p) for p in itertools.product(range(L), repeat=n)]), 0
        )
        gold = path_score(crf, LABELS, em, tuple(tags[i, :n].tolist()))
        torch.testing.assert_close(nll[i], log_z - gold, atol=1e-4, rtol=1e-5)
    assert nll[2] > 1e3  # a path that starts inside an entity is (all but) impossible
    assert (nll[:2] > 0).all()


def test_nll_gradient_is_finite_and_reaches_every_parameter():
    crf = random_crf(LABELS, 2)
    emissions = torch.randn(2, 3, 3, requires_grad=True)
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]], dtype=torch.bool)
    crf.nll(emissions, torch.tensor([[1, 2, 0], [0, 0, -100]]), mask).sum().backward()
    assert torch.isfinite(emissions.grad).all()
    assert emissions.grad[1, 2].abs().max() == 0  # a masked word takes no part
    for p in crf.parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all() and p.grad.abs().sum() > 0


def test_viterbi_equals_brute_force_argmax():
    for seed in range(5):
        crf = random_crf(LABELS, 10 + seed)
        L, W = 3, 3
        emissions = torch.randn(4, W, L, generator=torch.Generator().manual_seed(seed)) * 2
        mask = torch.tensor([[1, 1, 1], [1, 1, 0], [1, 0, 0], [1, 1, 1]], dtype=torch.bool)
        paths = crf.decode(emissions, mask)
        for i, path in enumerate(paths):
            n = int(mask[i].sum())
            best = max(
                itertools.product(range(L), repeat=n),
                key=lambda p, i=i, n=n: path_score(crf, LABELS, emissions[i, :n], p),
            )
            assert tuple(path) == best, f"seed {seed} row {i}"


def continued_score(
    crf: CRF, labels: list[str], emissions: torch.Tensor, tags: tuple[int, ...], after: int, end: bool
) -> torch.Tensor:
    """Score of one sequence that follows tag ``after`` (-1: none, the start scores) and, without ``end``, goes on
    past its last word (no end score); impossible IOB2 moves penalised."""
    start_ok, trans_ok = iob2_allowed(labels)
    penalty = -1e4
    if after < 0:
        s = crf.start[tags[0]] + (0.0 if start_ok[tags[0]] else penalty)
    else:
        s = crf.transitions[after, tags[0]] + (0.0 if trans_ok[after, tags[0]] else penalty)
    s = s + emissions[0, tags[0]]
    for prev, cur, w in zip(tags, tags[1:], range(1, len(tags)), strict=False):
        s = s + crf.transitions[prev, cur] + (0.0 if trans_ok[prev, cur] else penalty) + emissions[w, cur]
    return s + crf.end[tags[-1]] if end else s


def test_continued_viterbi_equals_brute_force_argmax():
    """decode(after=..., end=...), what streaming runs on the words not yet emitted: every row its own previous tag
    (or none), with and without the end scores, rows of different lengths, against every IOB2 tag sequence."""
    labels = ["O", "B-PER", "I-PER", "B-LOC", "I-LOC"]
    L, W = len(labels), 4
    for seed in range(4):
        crf = random_crf(labels, 20 + seed)
        emissions = torch.randn(6, W, L, generator=torch.Generator().manual_seed(seed)) * 2
        emissions[..., [2, 4]] += 2.0  # I- tags likely: the previous tag decides whether they are allowed
        lengths = [4, 3, 1, 4, 2, 4]
        mask = torch.tensor([[w < n for w in range(W)] for n in lengths])
        after = torch.tensor([1, 2, 4, -1, 0, 3])
        for end in (True, False):
            paths = crf.decode(emissions, mask, after, end=end)
            for i, (path, n) in enumerate(zip(paths, lengths, strict=True)):
                prev = int(after[i])
                best = max(
                    itertools.product(range(L), repeat=n),
                    key=lambda p, i=i, n=n, prev=prev: continued_score(crf, labels, emissions[i, :n], p, prev, end),
                )
                assert tuple(path) == best, f"seed {seed} row {i} end {end}"


def test_decoded_paths_respect_iob2():
    labels = ["O", "B-PER", "I-PER", "B-LOC", "I-LOC"]
    crf = random_crf(labels, 3)
    gen = torch.Generator().manual_seed(7)
    emissions = torch.randn(64, 6, len(labels), generator=gen) * 3
    emissions[..., 2] += 4.0  # push hard towards I-PER / I-LOC everywhere
    emissions[..., 4] += 4.0
    lengths = torch.randint(1, 7, (64,), generator=gen)
    mask = torch.arange(6) < lengths[:, None]
    paths = crf.decode(emissions, mask)
    assert [len(p) for p in paths] == lengths.tolist()
    n_inside = 0
    for path in paths:
        prev = "O"
        for t in path:
            lab = labels[t]
            if lab.startswith("I-"):
                assert prev in (f"B-{lab[2:]}", f"I-{lab[2:]}"), f"{prev} -> {lab} in {path}"
                n_inside += 1
            prev = lab
    assert n_inside > 0  # the push worked: valid I- tags do appear


def test_iob2_allowed_table():
    start_ok, trans_ok = iob2_allowed(["O", "B-PER", "I-PER", "B-LOC", "I-LOC"])
    assert start_ok.tolist() == [True, True, False, True, False]
    assert trans_ok[:, 2].tolist() == [False, True, True, False, False]  # -> I-PER
    assert trans_ok[:, 4].tolist() == [False, False, False, True, True]  # -> I-LOC
    assert trans_ok[:, [0, 1, 3]].all()


def test_decode_of_a_row_without_words_is_empty():
    # Regression: CRF.decode used to return one tag for a row whose mask is all False (a sentence with no
    # words), where the softmax decoder returns [].
    crf = random_crf(LABELS, 4)
    paths = crf.decode(torch.randn(2, 3, 3), torch.tensor([[1, 1, 0], [0, 0, 0]], dtype=torch.bool))
    assert [len(p) for p in paths] == [2, 0]


def test_marginals_equal_brute_force_enumeration():
    """Forward-backward marginals against the probability mass of every tag sequence, summed per word and tag,
    on rows of different lengths (prefix masks) and five IOB2 labels (forbidden moves included)."""
    labels = ["O", "B-PER", "I-PER", "B-LOC", "I-LOC"]
    crf = random_crf(labels, 3)
    L, W = len(labels), 4
    emissions = torch.randn(3, W, L, generator=torch.Generator().manual_seed(4), dtype=torch.float64).float()
    lengths = [4, 2, 1]
    mask = torch.tensor([[w < n for w in range(W)] for n in lengths])
    got = crf.marginals(emissions, mask).detach().double()
    for i, n in enumerate(lengths):
        expected = torch.zeros(W, L, dtype=torch.float64)
        paths = list(itertools.product(range(L), repeat=n))
        scores = torch.stack([path_score(crf, labels, emissions[i], p).double() for p in paths])
        probs = torch.softmax(scores, 0)
        for p, prob in zip(paths, probs, strict=True):
            for w, tag in enumerate(p):
                expected[w, tag] += prob
        torch.testing.assert_close(got[i], expected, atol=1e-5, rtol=1e-4)
    assert torch.all(got[1, 2:] == 0) and torch.all(got[2, 1:] == 0)


def test_marginals_are_differentiable():
    crf = random_crf(LABELS, 5)
    emissions = torch.randn(2, 3, 3, requires_grad=True)
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]], dtype=torch.bool)
    crf.marginals(emissions, mask)[:, :, 1].sum().backward()
    assert emissions.grad is not None and torch.isfinite(emissions.grad).all()
    assert crf.transitions.grad is not None
