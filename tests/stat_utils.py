"""Shared helpers of the statistical tests (docs/verification.md §8): synthetic context-dependent target/draft
models, exact enumeration of their joints and expected accepted lengths, the Monte-Carlo
harness that runs a verification rule and completes its output to gamma+1 tokens, a
chi-square / G goodness-of-fit test that pools cells with small expected counts, and the
batched inverse-CDF draw. The vectorised PyTorch rules the harness must tell apart (correct
ones as controls, deliberately broken ones) are in ``rule_variants.py``; the Python Philox
(the coins of the ``*_philox`` ops) in ``philox_ref.py``.

Nothing here touches a GPU at import time; every entry point takes a ``device`` so a CUDA test
can reuse it (tables and statistics stay on the CPU, only the verify call runs on ``device``).

The synthetic models: a vocabulary of ``V`` tokens and blocks of ``gamma`` drafts. Every prefix
``x_1..x_k`` (k = 0..gamma) has its own target row ``p(. | x_1..x_k)`` and draft row
``q(. | x_1..x_k)``. Prefixes are numbered length by length, each length in base-V order:
``index(x_1..x_k) = offset[k] + sum_j x_j V^(k-1-j)`` with ``offset[k] = sum_{j<k} V^j``.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from fractions import Fraction
from typing import Callable, Sequence

import torch
from torch import Tensor

# ------------------------------------------------------------------------------------ rows

TARGET_ROW_KINDS = ("random", "sparse", "one_hot", "near_uniform", "peaked")
DRAFT_ROW_RELATIONS = ("equal", "close", "independent", "one_hot", "near_uniform", "sparse")


def random_row(kind: str, V: int, gen: torch.Generator) -> Tensor:
    """One float64 probability row of length ``V`` of the given kind.

    Kinds: ``random`` (Dirichlet(1)), ``sparse`` (random with about half the entries exactly 0,
    at least one kept), ``one_hot``, ``near_uniform`` (1/V perturbed by a few percent),
    ``peaked`` (one token holds most of the mass, the others small but positive).
    """
    if kind == "random":
        row = -torch.rand(V, generator=gen, dtype=torch.float64).clamp_min(1e-12).log()
    elif kind == "sparse":
        row = torch.rand(V, generator=gen, dtype=torch.float64) + 0.05
        zero = torch.rand(V, generator=gen) < 0.5
        zero[int(torch.randint(V, (1,), generator=gen))] = False
        row[zero] = 0.0
    elif kind == "one_hot":
        row = torch.zeros(V, dtype=torch.float64)
        row[int(torch.randint(V, (1,), generator=gen))] = 1.0
    elif kind == "near_uniform":
        row = 1.0 + 0.05 * (torch.rand(V, generator=gen, dtype=torch.float64) - 0.5)
    elif kind == "peaked":
        row = 0.02 + 0.1 * torch.rand(V, generator=gen, dtype=torch.float64)
        row[int(torch.randint(V, (1,), generator=gen))] = 1.0
    else:
        raise ValueError(f"kind: unknown row kind {kind!r}")
    return row / row.sum()


def draft_row(relation: str, p: Tensor, gen: torch.Generator) -> Tensor:
    """A draft row ``q`` for the target row ``p``: ``equal`` (q == p), ``close`` (a 80/20 mix
    of p and a random row), ``independent`` (a fresh row of a random kind), or a fresh row of
    the named kind (``one_hot``, ``near_uniform``, ``sparse``)."""
    V = p.numel()
    if relation == "equal":
        return p.clone()
    if relation == "close":
        q = 0.8 * p + 0.2 * random_row("random", V, gen)
        return q / q.sum()
    if relation == "independent":
        kind = TARGET_ROW_KINDS[int(torch.randint(len(TARGET_ROW_KINDS), (1,), generator=gen))]
        return random_row(kind, V, gen)
    return random_row(relation, V, gen)


# ---------------------------------------------------------------------------------- tables


def num_prefixes(V: int, max_len: int) -> int:
    """How many prefixes of length 0..max_len there are: ``sum_k V^k``."""
    return sum(V**k for k in range(max_len + 1))


def prefix_offsets(V: int, max_len: int) -> list[int]:
    """``offset[k]`` = the index of the first prefix of length k."""
    return [num_prefixes(V, k - 1) if k > 0 else 0 for k in range(max_len + 1)]


@dataclass
class PrefixTables:
    """A synthetic target/draft pair: one conditional row per prefix.

    Shape:
        target: ``[num_prefixes(V, gamma), V]`` float64 — ``p(. | prefix)`` for prefixes of
            length 0..gamma (the target also scores position gamma+1).
        draft: same shape — ``q(. | prefix)`` (rows for prefixes of length gamma are unused).
    """

    V: int
    gamma: int
    target: Tensor
    draft: Tensor

    def index(self, prefixes: Tensor) -> Tensor:
        """Row index of each prefix. Shape: prefixes ``[N, k]`` int64 (k may be 0) -> ``[N]``."""
        k = prefixes.shape[1]
        place = torch.tensor([self.V ** (k - 1 - j) for j in range(k)], dtype=torch.int64)
        return (prefixes.cpu() * place).sum(-1) + prefix_offsets(self.V, self.gamma)[k]

    def rounded(self, dtype: torch.dtype) -> "PrefixTables":
        """The same pair with every row rounded to ``dtype`` and renormalised in float64, so the
        exact joint describes what a kernel reading ``dtype`` rows really sees."""

        def r(t: Tensor) -> Tensor:
            t = t.to(dtype).double()
            return t / t.sum(-1, keepdim=True)

        return PrefixTables(self.V, self.gamma, r(self.target), r(self.draft))


def make_tables(
    V: int,
    gamma: int,
    seed: int,
    *,
    target_kinds: Sequence[str] = TARGET_ROW_KINDS,
    draft_relations: Sequence[str] = DRAFT_ROW_RELATIONS,
) -> PrefixTables:
    """Random context-dependent tables: every prefix draws its target row's kind from
    ``target_kinds`` and its draft row's relation to the target from ``draft_relations``
    (so one pair mixes zeros, one-hots, p == q and near-uniform rows)."""
    gen = torch.Generator().manual_seed(seed)
    rows = num_prefixes(V, gamma)
    target = torch.empty(rows, V, dtype=torch.float64)
    draft = torch.empty(rows, V, dtype=torch.float64)
    for r in range(rows):
        kind = target_kinds[int(torch.randint(len(target_kinds), (1,), generator=gen))]
        target[r] = random_row(kind, V, gen)
        relation = draft_relations[int(torch.randint(len(draft_relations), (1,), generator=gen))]
        draft[r] = draft_row(relation, target[r], gen)
    return PrefixTables(V, gamma, target, draft)


def context_free_tables(p: Sequence[float], q: Sequence[float], gamma: int) -> PrefixTables:
    """Tables whose rows do not depend on the prefix (every prefix has p and q)."""
    p_row = torch.tensor(p, dtype=torch.float64)
    q_row = torch.tensor(q, dtype=torch.float64)
    rows = num_prefixes(len(p), gamma)
    return PrefixTables(len(p), gamma, p_row.expand(rows, -1).clone(), q_row.expand(rows, -1).clone())


def greedy_target(tables: PrefixTables) -> PrefixTables:
    """The temperature-0 target of ``tables``: each target row one-hot on its argmax (lowest
    id on ties); draft rows unchanged."""
    one_hot = torch.nn.functional.one_hot(tables.target.argmax(-1), tables.V).double()
    return PrefixTables(tables.V, tables.gamma, one_hot, tables.draft.clone())


# ------------------------------------------------------------------------ exact enumeration


def exact_joint(table: Tensor, V: int, length: int) -> Tensor:
    """The exact joint ``P(x_1..x_L) = prod_k table(x_k | x_<k)`` of ``length`` tokens.

    Shape:
        table: ``[num_prefixes, V]`` (target or draft of :class:`PrefixTables`);
        returns ``[V^length]`` float64, cell ``sum_j x_j V^(L-1-j)`` (base-V order).
    """
    offsets = prefix_offsets(V, length)
    joint = torch.ones(1, dtype=torch.float64)
    for k in range(length):
        rows = table[offsets[k] : offsets[k] + V**k].double()  # every prefix of length k, base-V order
        joint = (joint[:, None] * rows).reshape(-1)
    return joint


def sequence_cells(sequences: Tensor, V: int) -> Tensor:
    """Base-V cell index of each sequence. Shape: ``[N, L]`` int64 -> ``[N]``."""
    L = sequences.shape[1]
    weights = torch.tensor([V ** (L - 1 - j) for j in range(L)], dtype=torch.int64)
    return (sequences.cpu() * weights).sum(-1)


def _row_fn(table: Tensor, V: int, gamma: int) -> Callable[[tuple[int, ...]], list[float]]:
    offsets = prefix_offsets(V, gamma)
    rows = table.tolist()

    def row(prefix: tuple[int, ...]) -> list[float]:
        idx = offsets[len(prefix)]
        for j, x in enumerate(prefix):
            idx += x * V ** (len(prefix) - 1 - j)
        return rows[idx]

    return row


def table_row_fns(tables: PrefixTables):
    """``(p_fn, q_fn)``: prefix tuple -> row as a list of floats, for the enumerators below."""
    return _row_fn(tables.target, tables.V, tables.gamma), _row_fn(tables.draft, tables.V, tables.gamma)


def exact_expected_accepted(p_fn, q_fn, V: int, gamma: int, rule: str):
    """Exact ``E[tau]`` over drafts ``x ~ q`` by enumerating every draft prefix (docs/verification.md §8).

    ``p_fn(prefix)`` / ``q_fn(prefix)`` return the conditional rows (lists of floats or of
    :class:`fractions.Fraction`, in which case the result is an exact Fraction).

    - ``token``: ``sum_i E[prod_{k<=i} min(1, p_k(x_k) / q_k(x_k))]``
    - ``block``: ``sum_i E[w_i]``, ``w_i = min(1, w_{i-1} p_i(x_i) / q_i(x_i))``
    - ``ideal``: ``sum_i (1 - TV(p^(i), q^(i)))`` over the joints of i tokens, the
      full-information upper bound of every valid rule.
    """
    total = 0
    if rule == "ideal":
        for i in range(1, gamma + 1):
            for block in itertools.product(range(V), repeat=i):
                p_joint = q_joint = 1
                for k, x in enumerate(block):
                    p_joint *= p_fn(block[:k])[x]
                    q_joint *= q_fn(block[:k])[x]
                total += min(p_joint, q_joint)
        return total
    if rule not in ("token", "block"):
        raise ValueError(f"rule: expected token, block or ideal, got {rule!r}")

    def walk(prefix: tuple[int, ...], q_prefix, weight):
        # Adds E-contributions of every extension of `prefix` (which has probability q_prefix
        # under the draft and weight = prod min(1, ratio) (token) or w_{len(prefix)} (block)).
        if len(prefix) == gamma:
            return 0
        p_row, q_row = p_fn(prefix), q_fn(prefix)
        acc = 0
        for x in range(V):
            if q_row[x] == 0:
                continue  # never drafted
            ratio = p_row[x] / q_row[x]
            w = weight * min(1, ratio) if rule == "token" else min(1, weight * ratio)
            q_next = q_prefix * q_row[x]
            acc += q_next * w + walk(prefix + (x,), q_next, w)
        return acc

    return walk((), 1, 1)


def fractions_of(values: Sequence) -> list[Fraction]:
    """Exact Fractions of small rationals given as Fractions, ints or strings like '1/3'."""
    return [Fraction(v) for v in values]


# -------------------------------------------------------------------- goodness of fit


@dataclass
class FitResult:
    """Outcome of :func:`goodness_of_fit`.

    ``impossible`` counts observations in cells of exact probability 0 (any such observation
    proves the distributions differ; ``pvalue`` is then 0). ``cells`` is the number of bins
    after pooling, ``dof = cells - 1``."""

    statistic: float
    dof: int
    pvalue: float
    impossible: int
    cells: int

    def __str__(self) -> str:
        return (f"stat={self.statistic:.1f} dof={self.dof} p={self.pvalue:.3g} "
                f"impossible={self.impossible} cells={self.cells}")


def pool_cells(observed: Tensor, expected: Tensor, min_expected: float) -> tuple[Tensor, Tensor]:
    """Merge cells with expected count below ``min_expected``: sorted by expected count, the
    small cells are grouped consecutively until each group reaches ``min_expected``; a last
    group still too small joins the smallest remaining bin. Cells of probability 0 must be
    removed before. Returns the pooled (observed, expected) float64 counts."""
    small = expected < min_expected
    big_obs, big_exp = observed[~small].tolist(), expected[~small].tolist()
    order = torch.argsort(expected[small])
    small_obs, small_exp = observed[small][order].tolist(), expected[small][order].tolist()
    groups_obs, groups_exp = [], []
    acc_o = acc_e = 0.0
    for o, e in zip(small_obs, small_exp):
        acc_o += o
        acc_e += e
        if acc_e >= min_expected:
            groups_obs.append(acc_o)
            groups_exp.append(acc_e)
            acc_o = acc_e = 0.0
    bins_obs, bins_exp = big_obs + groups_obs, big_exp + groups_exp
    if acc_e > 0.0 or acc_o > 0.0:
        if bins_exp:
            j = min(range(len(bins_exp)), key=lambda i: bins_exp[i])
            bins_obs[j] += acc_o
            bins_exp[j] += acc_e
        else:
            bins_obs, bins_exp = [acc_o], [acc_e]
    return torch.tensor(bins_obs, dtype=torch.float64), torch.tensor(bins_exp, dtype=torch.float64)


def goodness_of_fit(counts: Tensor, probs: Tensor, *, method: str = "chi2", min_expected: float = 5.0) -> FitResult:
    """Chi-square (Pearson) or G (likelihood-ratio) test that ``counts`` were drawn from ``probs``.

    Shape:
        counts: ``[C]`` observed counts; probs: ``[C]`` exact cell probabilities (sum 1).

    Cells of probability exactly 0 are not tested but counted in ``impossible`` (p-value 0 if
    any); cells with expected count below ``min_expected`` are pooled (:func:`pool_cells`).
    """
    from scipy import stats  # imported lazily: only the statistical tests need scipy

    counts = counts.double().cpu()
    probs = probs.double().cpu()
    n = float(counts.sum())
    zero = probs == 0
    impossible = int(counts[zero].sum())
    observed, expected = pool_cells(counts[~zero], probs[~zero] * n, min_expected)
    dof = observed.numel() - 1
    if method == "chi2":
        statistic = float(((observed - expected) ** 2 / expected).sum())
    elif method == "g":
        nz = observed > 0
        statistic = float(2.0 * (observed[nz] * (observed[nz] / expected[nz]).log()).sum())
    else:
        raise ValueError(f"method: expected 'chi2' or 'g', got {method!r}")
    pvalue = float(stats.chi2.sf(statistic, dof)) if dof > 0 else 1.0
    if impossible:
        pvalue = 0.0
    return FitResult(statistic, dof, pvalue, impossible, observed.numel())


# ------------------------------------------------------------------ the Monte-Carlo harness


def sample_rows(rows: Tensor, gen: torch.Generator) -> Tensor:
    """One token from each row (inverse CDF with one uniform each; exact for float64 rows).
    Shape: ``[N, V]`` float64 -> ``[N]`` int64."""
    u = torch.rand(rows.shape[0], generator=gen, dtype=torch.float64)
    return inverse_cdf(rows, u)


def draw_drafts(tables: PrefixTables, N: int, gen: torch.Generator) -> Tensor:
    """``N`` draft blocks, each drawn token by token from the draft's conditionals. ``[N, gamma]``."""
    drafts = torch.empty(N, 0, dtype=torch.int64)
    for _ in range(tables.gamma):
        nxt = sample_rows(tables.draft[tables.index(drafts)], gen)
        drafts = torch.cat([drafts, nxt[:, None]], 1)
    return drafts


def gather_rows(tables: PrefixTables, drafts: Tensor) -> tuple[Tensor, Tensor]:
    """The rows a verifier sees for each draft block: target ``p_1..p_{gamma+1}``
    ``[N, gamma+1, V]`` and draft ``q_1..q_gamma`` ``[N, gamma, V]``, float64."""
    g = tables.gamma
    p = torch.stack([tables.target[tables.index(drafts[:, :k])] for k in range(g + 1)], 1)
    q = torch.stack([tables.draft[tables.index(drafts[:, :k])] for k in range(g)], 1)
    return p, q


def complete_with_target(tables: PrefixTables, tokens: Tensor, gen: torch.Generator) -> Tensor:
    """Fill the ``-1`` tail of every output row by sampling from the target's own conditionals,
    giving exactly gamma+1 tokens per row. Shape: ``[N, gamma+1]`` -> ``[N, gamma+1]``."""
    seq = tokens.clone().cpu()
    for k in range(tables.gamma + 1):
        missing = seq[:, k] < 0
        if bool(missing.any()):
            rows = tables.target[tables.index(seq[missing, :k])]
            seq[missing, k] = sample_rows(rows, gen)
    return seq


def check_output_structure(out_tokens: Tensor, accepted_len: Tensor, drafts: Tensor, num_draft: Tensor, V: int) -> None:
    """Every row: ``0 <= tau <= n``, the first tau tokens are the drafts, then one token in
    ``[0, V)``, then ``-1`` padding. Raises AssertionError naming the first bad row."""
    N, width = out_tokens.shape
    tau = accepted_len.cpu()
    out = out_tokens.cpu()
    assert bool(((tau >= 0) & (tau <= num_draft.cpu())).all()), "accepted_len outside [0, num_draft_tokens]"
    pos = torch.arange(width)[None, :]
    prefix_ok = torch.where(pos < tau[:, None], out[:, :width] == torch.cat([drafts.cpu(), drafts.new_zeros(N, 1).cpu()], 1), True)
    emitted = out.gather(1, tau[:, None])[:, 0]
    pad_ok = torch.where(pos > tau[:, None], out == -1, True)
    bad = ~(prefix_ok.all(1) & pad_ok.all(1) & (emitted >= 0) & (emitted < V))
    assert not bool(bad.any()), f"malformed output row {int(torch.nonzero(bad)[0])}: {out[torch.nonzero(bad)[0]].tolist()}"


@dataclass
class LosslessRun:
    """What :func:`run_lossless_experiment` measured."""

    fit: FitResult
    sequences: Tensor  # [N, gamma+1] completed outputs
    accepted_len: Tensor  # [N]
    num_draft: Tensor  # [N]


def run_lossless_experiment(
    tables: PrefixTables,
    rule: str,
    N: int,
    seed: int,
    *,
    ragged: bool = False,
    dtype: torch.dtype = torch.float32,
    device: str | torch.device = "cpu",
    method: str = "chi2",
    verify_fn: Callable | None = None,
    pass_draft: bool = True,
    garbage_unused_drafts: bool = True,
    **rule_options,
) -> LosslessRun:
    """Spec §8: one verify call over N rows (each row its own sample), output completed to
    gamma+1 tokens from the target, empirical joint compared with the exact target joint.

    ``ragged`` gives every row a random ``num_draft_tokens`` in 0..gamma (unused drafts are
    overwritten with out-of-range ids when ``garbage_unused_drafts``, which the op must
    ignore). ``verify_fn`` defaults to :func:`specdecode.verify`.
    """
    import specdecode

    verify_fn = verify_fn or specdecode.verify
    gen = torch.Generator().manual_seed(seed)
    drafts = draw_drafts(tables, N, gen)
    p, q = gather_rows(tables, drafts)
    g = tables.gamma
    if ragged:
        num_draft = torch.randint(0, g + 1, (N,), generator=gen)
        if garbage_unused_drafts:
            unused = torch.arange(g)[None, :] >= num_draft[:, None]
            drafts = torch.where(unused, torch.full_like(drafts, tables.V + 3), drafts)
    else:
        num_draft = torch.full((N,), g, dtype=torch.int64)
    verify_gen = torch.Generator(device=device).manual_seed(seed + 1)
    out = verify_fn(
        p.to(device=device, dtype=dtype),
        q.to(device=device, dtype=dtype) if pass_draft else None,
        drafts.to(device),
        rule=rule,
        num_draft_tokens=num_draft.to(device) if ragged else None,
        generator=verify_gen,
        **rule_options,
    )
    tokens, accepted_len = out.tokens.cpu(), out.accepted_len.cpu()
    check_output_structure(tokens, accepted_len, drafts, num_draft, tables.V)
    seq = complete_with_target(tables, tokens, gen)
    counts = torch.bincount(sequence_cells(seq, tables.V), minlength=tables.V ** (g + 1))
    fit = goodness_of_fit(counts, exact_joint(tables.target, tables.V, g + 1), method=method)
    return LosslessRun(fit, seq, accepted_len, num_draft)


# ------------------------------------------------------------------------ inverse-CDF draws


def inverse_cdf(weights: Tensor, u: Tensor) -> Tensor:
    """Batched inverse-CDF draw (docs/verification.md §7): the first x with ``cumsum[x] > u * total`` and
    ``weights[x] > 0``; the last positive token if rounding leaves none; -1 for zero mass.

    Shape: weights ``[N, V]`` float64 >= 0, u ``[N]`` -> ``[N]`` int64."""
    cum = weights.cumsum(-1)
    total = cum[:, -1]
    positive = weights > 0
    hit = (cum > (u * total)[:, None]) & positive
    first = hit.int().argmax(-1)
    V = weights.shape[1]
    last_positive = V - 1 - positive.flip(-1).int().argmax(-1)
    idx = torch.where(hit.any(-1), first, last_positive)
    return torch.where(total > 0, idx, torch.full_like(idx, -1))
