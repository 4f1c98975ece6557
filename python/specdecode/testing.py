"""Exact statistical tests of verification rules: is a rule lossless?

A rule is lossless when its output, completed to a fixed length by sampling from the target,
has exactly the target's joint distribution, whatever the draft. These helpers check it on
small synthetic models where that joint is known exactly: every prefix ``x_1..x_k`` has its own
target row ``p(. | x_1..x_k)`` and draft row ``q(. | x_1..x_k)`` of mixed kinds (random,
sparse with zeros, one-hot, near-uniform, peaked; q equal to p, close to it, independent,
one-hot, sparse), so one run meets the corner cases a real model rarely shows.

- :func:`exact_test` drafts chains from q, verifies them with a chain rule (a registered name
  or a function written like one, :func:`specdecode.register_rule`), completes each output to
  ``num_draft_tokens + 1`` tokens from p, and compares the counts of every sequence with the
  target's exact joint by a chi-square test (:func:`goodness_of_fit`).
- :func:`exact_tree_test` does the same for a tree rule on trees of one shape whose children
  are drafted by a scheme (``iid``, ``without_replacement`` or ``deterministic``).

A lossless rule passes (its p-value is uniform on [0, 1]: it fails at level ``alpha`` one time in
``1 / alpha``); a biased one fails once ``num_samples`` is large enough to see its bias, and any
output of probability 0 under the target fails it at once. A pass is evidence, not proof: test
several seeds and sizes, and a broken variant of your rule, to see the test can tell.

>>> import specdecode.testing as st
>>> st.exact_test("token", num_samples=20_000, seed=1).passed
True
>>> st.exact_test("typical", num_samples=20_000, seed=1, epsilon=0.3).passed
False
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch
from torch import Tensor

from specdecode.rule_checks import check_chain_output
from specdecode.trees import TokenTree, TreeShape, verify_tree
from specdecode.verify import verify

TARGET_KINDS = ("random", "sparse", "one_hot", "near_uniform", "peaked")
DRAFT_RELATIONS = ("equal", "close", "independent", "one_hot", "near_uniform", "sparse")


def _row(kind: str, V: int, gen: torch.Generator) -> Tensor:
    """One float64 probability row of ``kind`` (see the module docstring); sparse rows keep at
    least two tokens (trees draw two distinct children from them)."""
    u = torch.rand(V, generator=gen, dtype=torch.float64)
    pick = int(torch.randint(V, (1,), generator=gen))
    if kind == "random":
        row = -u.clamp_min(1e-12).log()
    elif kind == "sparse":
        row = u + 0.05
        keep = torch.rand(V, generator=gen) >= 0.5
        keep[pick] = keep[(pick + 1) % V] = True
        row = torch.where(keep, row, 0.0)
    elif kind == "one_hot":
        row = torch.zeros(V, dtype=torch.float64)
        row[pick] = 1.0
    elif kind == "near_uniform":
        row = 1.0 + 0.05 * (u - 0.5)
    elif kind == "peaked":
        row = 0.02 + 0.1 * u
        row[pick] = 1.0
    else:
        raise ValueError(f"kind: unknown row kind {kind!r}; kinds: {', '.join(TARGET_KINDS)}")
    return row / row.sum()


@dataclass(frozen=True)
class Tables:
    """A synthetic target/draft pair over ``vocab_size`` tokens with one row per prefix of
    length ``0..depth``; prefixes are numbered length by length, each in base-V order.

    Shape:
        target: ``[sum_k V^k, V]`` float64 — ``p(. | prefix)``.
        draft: same shape — ``q(. | prefix)``.
    """

    vocab_size: int
    depth: int
    target: Tensor
    draft: Tensor

    def index(self, prefixes: Tensor) -> Tensor:
        """Row of each prefix. Shape: ``[N, k]`` int64 (k may be 0) -> ``[N]``."""
        V, k = self.vocab_size, prefixes.shape[1]
        place = torch.tensor([V ** (k - 1 - j) for j in range(k)], dtype=torch.int64)
        return (prefixes * place).sum(-1) + sum(V**j for j in range(k))


def random_tables(vocab_size: int = 4, depth: int = 3, seed: int = 0, *, draft_zeros: bool = True) -> Tables:
    """Random context-dependent tables: each prefix draws its target row's kind and its draft
    row's relation to it. ``draft_zeros`` False keeps every draft row positive (one-hot and
    sparse drafts become near-uniform)."""
    if isinstance(vocab_size, bool) or not isinstance(vocab_size, int) or vocab_size < 2:
        raise ValueError(f"vocab_size: expected an int >= 2, got {vocab_size!r}")
    if isinstance(depth, bool) or not isinstance(depth, int) or depth < 1:
        raise ValueError(f"depth: expected an int >= 1, got {depth!r}")
    V, gen = vocab_size, torch.Generator().manual_seed(seed)
    rows = sum(V**k for k in range(depth + 1))
    target = torch.empty(rows, V, dtype=torch.float64)
    draft = torch.empty(rows, V, dtype=torch.float64)
    for r in range(rows):
        target[r] = _row(TARGET_KINDS[int(torch.randint(len(TARGET_KINDS), (1,), generator=gen))], V, gen)
        relation = DRAFT_RELATIONS[int(torch.randint(len(DRAFT_RELATIONS), (1,), generator=gen))]
        if not draft_zeros and relation in ("one_hot", "sparse", "equal", "independent"):
            relation = "near_uniform" if relation != "equal" else "close"
        if relation == "equal":
            draft[r] = target[r]
        elif relation == "close":
            mix = 0.8 * target[r] + 0.2 * _row("random", V, gen)
            draft[r] = mix / mix.sum()
        elif relation == "independent":
            draft[r] = _row(TARGET_KINDS[int(torch.randint(len(TARGET_KINDS), (1,), generator=gen))], V, gen)
        else:
            draft[r] = _row(relation, V, gen)
    return Tables(V, depth, target, draft)


def exact_joint(tables: Tables, length: int) -> Tensor:
    """The target's exact joint of ``length`` tokens, ``prod_k p(x_k | x_<k)``.

    Shape: returns ``[V^length]`` float64, cell ``sum_j x_j V^(length-1-j)``."""
    V, joint = tables.vocab_size, torch.ones(1, dtype=torch.float64)
    for k in range(length):
        start = sum(V**j for j in range(k))
        joint = (joint[:, None] * tables.target[start: start + V**k]).reshape(-1)
    return joint


@dataclass(frozen=True)
class LawTest:
    """Outcome of a goodness-of-fit test: Pearson's ``statistic`` with ``dof`` degrees of
    freedom after pooling small cells, its ``pvalue``, ``impossible`` (outputs the target
    gives probability 0: any makes ``pvalue`` 0), ``num_samples`` and the verdict ``passed``
    (``pvalue >= alpha``)."""

    statistic: float
    dof: int
    pvalue: float
    impossible: int
    num_samples: int
    alpha: float

    @property
    def passed(self) -> bool:
        return self.pvalue >= self.alpha

    def __str__(self) -> str:
        verdict = "consistent with the target (pass)" if self.passed else "differs from the target (FAIL)"
        return (f"{verdict}: chi2 {self.statistic:.1f} on {self.dof} dof, p = {self.pvalue:.3g}, "
                f"{self.impossible} impossible outputs, {self.num_samples} samples")


def goodness_of_fit(counts: Tensor, probs: Tensor, *, alpha: float = 1e-3, min_expected: float = 5.0) -> LawTest:
    """Chi-square test that ``counts`` were drawn from ``probs``; cells of expected count
    below ``min_expected`` are pooled (smallest first) until each group reaches it.

    Shape: counts ``[C]``, probs ``[C]`` (summing to 1)."""
    counts, probs = counts.double().flatten().cpu(), probs.double().flatten().cpu()
    n = float(counts.sum())
    zero = probs == 0
    impossible = int(counts[zero].sum())
    observed, expected = counts[~zero], probs[~zero] * n
    small = expected < min_expected
    order = torch.argsort(expected[small])
    bins_o, bins_e = observed[~small].tolist(), expected[~small].tolist()
    acc_o = acc_e = 0.0
    for o, e in zip(observed[small][order].tolist(), expected[small][order].tolist()):
        acc_o, acc_e = acc_o + o, acc_e + e
        if acc_e >= min_expected:
            bins_o.append(acc_o)
            bins_e.append(acc_e)
            acc_o = acc_e = 0.0
    if acc_e > 0 or acc_o > 0:
        if bins_e:
            j = min(range(len(bins_e)), key=bins_e.__getitem__)
            bins_o[j] += acc_o
            bins_e[j] += acc_e
        else:
            bins_o, bins_e = [acc_o], [acc_e]
    o, e = torch.tensor(bins_o, dtype=torch.float64), torch.tensor(bins_e, dtype=torch.float64)
    statistic = float(((o - e) ** 2 / e).sum())
    dof = len(bins_o) - 1
    pvalue = float(torch.special.gammaincc(torch.tensor(dof / 2.0), torch.tensor(statistic / 2.0))) if dof else 1.0
    return LawTest(statistic, dof, 0.0 if impossible else pvalue, impossible, int(n), alpha)


def _check_run(num_samples: int, alpha: float, tables: Tables | None, depth: int) -> None:
    if isinstance(num_samples, bool) or not isinstance(num_samples, int) or num_samples < 1:
        raise ValueError(f"num_samples: expected an int >= 1, got {num_samples!r}")
    if not 0.0 < alpha < 1.0:
        raise ValueError(f"alpha: expected a level in (0, 1), got {alpha!r}")
    if tables is not None:
        if not isinstance(tables, Tables):
            raise TypeError(f"tables: expected specdecode.testing.Tables, got {type(tables).__name__}")
        if tables.depth < depth:
            raise ValueError(f"tables: rows for prefixes up to length {depth} are needed, these stop at {tables.depth}")


def _draw(rows: Tensor, gen: torch.Generator) -> Tensor:
    return torch.multinomial(rows, 1, generator=gen)[:, 0]


def _complete(tables: Tables, tokens: Tensor, length: int, gen: torch.Generator) -> Tensor:
    """Fill each row's ``-1`` tail with draws from the target. ``[N, length]`` -> same."""
    seq = tokens.clone()
    for k in range(length):
        missing = seq[:, k] < 0
        if bool(missing.any()):
            seq[missing, k] = _draw(tables.target[tables.index(seq[missing, :k])], gen)
    return seq


def _law(tables: Tables, tokens: Tensor, length: int, gen: torch.Generator, alpha: float) -> LawTest:
    seq = _complete(tables, tokens, length, gen)
    V = tables.vocab_size
    cells = (seq * torch.tensor([V ** (length - 1 - j) for j in range(length)])).sum(-1)
    counts = torch.bincount(cells, minlength=V**length)
    return goodness_of_fit(counts, exact_joint(tables, length), alpha=alpha)


def exact_test(rule: str | Callable[..., Any], *, num_draft_tokens: int = 3, vocab_size: int = 4,
               num_samples: int = 50_000, seed: int = 0, alpha: float = 1e-3, tables: Tables | None = None,
               **rule_options: Any) -> LawTest:
    """Chi-square test that chain rule ``rule`` (a name for :func:`specdecode.verify`, or a
    function written for :func:`specdecode.register_rule`) is lossless.

    ``num_samples`` chains of ``num_draft_tokens`` drafts are drawn from the tables' draft
    (``random_tables(vocab_size, num_draft_tokens, seed)`` unless ``tables`` is given) and
    verified in one call with ``rule_options``; each output (checked like any user rule's) is
    completed from the target and counted. ``V^(num_draft_tokens + 1)`` cells: keep it small.
    """
    _check_run(num_samples, alpha, tables, 1)
    tables = tables if tables is not None else random_tables(vocab_size, num_draft_tokens, seed)
    gen = torch.Generator().manual_seed(seed + 1)
    g, N = tables.depth, num_samples
    drafts = torch.empty(N, 0, dtype=torch.int64)
    for _ in range(g):
        drafts = torch.cat([drafts, _draw(tables.draft[tables.index(drafts)], gen)[:, None]], 1)
    p = torch.stack([tables.target[tables.index(drafts[:, :k])] for k in range(g + 1)], 1)
    q = torch.stack([tables.draft[tables.index(drafts[:, :k])] for k in range(g)], 1)
    uniforms = torch.rand(N, g + 1, generator=gen, dtype=torch.float64)
    if callable(rule):
        n = torch.full((N,), g, dtype=torch.int64)
        result = rule(p, q, drafts, num_draft_tokens=n, uniforms=uniforms, **rule_options)
        out = check_chain_output(result, getattr(rule, "__name__", "rule"), drafts, n, tables.vocab_size)
    else:
        out = verify(p, q, drafts, rule=rule, uniforms=uniforms, **rule_options)
    return _law(tables, out.tokens, g + 1, gen, alpha)


def _draw_children(rows: Tensor, k: int, children: str, gen: torch.Generator) -> Tensor:
    """``k`` children per row of ``rows`` ``[N, V]`` by ``children``. Returns ``[N, k]``."""
    if children == "iid":
        return torch.multinomial(rows, k, replacement=True, generator=gen)
    if children == "without_replacement":
        return torch.multinomial(rows, k, replacement=False, generator=gen)
    if children == "deterministic":  # top-k of q, lowest id first on ties
        return torch.sort(-rows, dim=-1, stable=True).indices[:, :k]
    raise ValueError(f"children: expected 'iid', 'without_replacement' or 'deterministic', got {children!r}")


def exact_tree_test(rule: str, *, shape: Sequence[Sequence[int]] = ((0,), (1,), (0, 0), (0, 1), (1, 0)),
                    children: str = "iid", vocab_size: int = 3, num_samples: int = 30_000, seed: int = 0,
                    alpha: float = 1e-3, tables: Tables | None = None, **rule_options: Any) -> LawTest:
    """Chi-square test that tree rule ``rule`` (built-in or registered with
    :func:`specdecode.trees.register_tree_rule`) is lossless for trees of ``shape`` (rank paths,
    as ``generate``'s ``tree=``) whose children are drafted by ``children``.

    Every node's children are drawn from the draft row of its context; the trees go through
    :func:`specdecode.verify_tree` at temperature 1 in one call; each output is completed from
    the target to ``depth + 1`` tokens and counted. Keep ``vocab_size ** (depth + 1)`` small.
    """
    tree_shape = TreeShape.from_paths([list(path) for path in shape])
    D, n_nodes = tree_shape.max_depth, tree_shape.num_nodes
    _check_run(num_samples, alpha, tables, D)
    tables = tables if tables is not None else random_tables(vocab_size, D, seed, draft_zeros=children == "iid")
    V, N = tables.vocab_size, num_samples
    gen = torch.Generator().manual_seed(seed + 1)
    tokens = torch.zeros(N, n_nodes, dtype=torch.int64)
    row = torch.zeros(N, n_nodes, dtype=torch.int64)  # each node's context row in the tables
    for v in range(n_nodes):
        if v:
            parent, depth = tree_shape.parents[v], tree_shape.depth[v]
            code = row[:, parent] - sum(V**j for j in range(depth - 1))
            row[:, v] = code * V + tokens[:, v] + sum(V**j for j in range(depth))
        kids = tree_shape.children(v)
        if kids:
            tokens[:, list(kids)] = _draw_children(tables.draft[row[:, v]], len(kids), children, gen)
    parents = torch.tensor(tree_shape.parents, dtype=torch.int64).expand(N, -1).contiguous()
    tree = TokenTree(tokens, parents, torch.full((N,), n_nodes, dtype=torch.int64))
    # log 0 = -inf: a masked token, as the ops define it, so the processed rows are the tables' own
    out = verify_tree(tables.target[row].log(), tables.draft[row].log(), tree, rule=rule,
                                 uniforms=torch.rand(N, n_nodes, generator=gen, dtype=torch.float64), **rule_options)
    width = D + 1
    return _law(tables, out.tokens[:, :width], width, gen, alpha)
