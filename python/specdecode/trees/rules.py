"""The tree verification rules: what each one guarantees and how its children must be drafted.

A tree rule is lossless only for the drafting scheme it was derived for, so the scheme is part
of its contract (``drafting`` below). :func:`register_tree_rule` adds a rule written in plain
PyTorch, checked on every call like a chain rule (``docs/rules.md``). :func:`list_tree_rules`
prints as a table:

>>> from specdecode.trees import list_tree_rules
>>> [r.name for r in list_tree_rules()]
['greedy', 'specinfer', 'rrs', 'deterministic', 'typical', 'traversal', 'traversal_iid', 'gbv', 'spectr', 'spechub']
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from specdecode.rules import declared_options

TreeRuleFn = Callable[..., Any]
#: The children schemes a tree can be drafted by (:mod:`specdecode.trees.builder_base`).
SCHEMES = ("deterministic", "iid", "without_replacement", "hub")


@dataclass(frozen=True)
class TreeRuleInfo:
    """One built-in tree rule.

    ``drafting`` is how the children of a node must be produced for ``lossless`` to hold;
    ``needs_draft_logits`` says whether :func:`specdecode.verify_tree` reads ``draft_logits``
    (the distribution each node's children were drafted from); ``options`` are the rule's
    keyword options with their defaults; ``compiled`` is False for a rule that runs in
    Python only (:mod:`specdecode.trees.python_rules`; no C++ / CUDA kernel; none now).
    A user rule (:func:`register_tree_rule`) has ``builtin`` False, its function ``fn``, and
    ``children``: the schemes its ``lossless`` claim holds for (empty: any, or lossy).
    """

    name: str
    lossless: bool
    drafting: str
    needs_draft_logits: bool
    options: dict[str, Any] = field(default_factory=dict)
    paper: str = ""
    description: str = ""
    compiled: bool = True
    builtin: bool = True
    fn: TreeRuleFn | None = None
    children: tuple[str, ...] = ()

    def __str__(self) -> str:
        loss = "lossless" if self.lossless else "lossy"
        where = "" if self.compiled else " [Python only]" if self.builtin else " [user]"
        return f"{self.name:13s} {loss:8s} children: {self.drafting}{where}"


_TREE_RULES: dict[str, TreeRuleInfo] = {
    r.name: r
    for r in [
        TreeRuleInfo(
            "greedy", False, "any (lossless at temperature 0 only)", False, {}, "exact at temperature 0",
            "accept the child equal to argmax p (lowest id on ties); emit argmax p",
        ),
        TreeRuleInfo(
            "specinfer", True, "i.i.d. draws from q at the node (a count fixed before drawing)", True, {},
            "Miao et al. 2024, SpecInfer (multi-step speculative sampling)",
            "R = p; child x accepted iff u < R(x)/q(x), else R = norm((R - q)+); emit y ~ R",
        ),
        TreeRuleInfo(
            "rrs", True, "draws without replacement from q at the node (distinct; a count fixed before drawing)",
            True, {}, "Jeon et al. 2024, Recursive Speculative Decoding; Chen et al. 2024, Sequoia",
            "R = p, D = q; child x accepted iff u < R(x)/D(x), else R = norm((R - D)+), D(x) = 0, D = norm(D); "
            "emit y ~ R",
        ),
        TreeRuleInfo(
            "deterministic", True,
            "any deterministic function of the context, distinct siblings (draft top-k, n-gram matches, static trees)",
            False, {}, "Chen et al. 2024, Sequoia (deterministic children)",
            "R = p; child x accepted iff u < R(x), else R(x) = 0, R = norm(R); emit y ~ R",
        ),
        TreeRuleInfo(
            "typical", False, "any", False, {"epsilon": 0.09, "delta": 0.3, "sample_correction": False},
            "Cai et al. 2024, Medusa (typical acceptance)",
            "accept the first child with p(x) > min(epsilon, delta exp(-H(p))); emit argmax p (or y ~ p)",
        ),
        TreeRuleInfo(
            "traversal", True, "draws without replacement from q at every node (distinct; a count fixed before drawing)",
            True, {}, "Weng et al. 2025, Traversal Verification for Speculative Tree Decoding",
            "leaves first (post-order): accept a node's whole path with probability alpha_v, the mass of its measure "
            "m_v; a rejected child sets m_v = (m_v - D)+ / sum (D - m_v)+ and removes the child from D",
        ),
        TreeRuleInfo(
            "traversal_iid", True, "i.i.d. draws from q at every node (a count fixed before drawing)",
            True, {}, "Weng et al. 2025, Traversal Verification for Speculative Tree Decoding",
            "traversal verification with D = q kept after a rejection (children drawn with replacement)",
        ),
        TreeRuleInfo(
            "gbv", True, "K i.i.d. paths of one length: the root's children, each the head of a chain, all i.i.d.",
            True, {}, "after Thomas & Pal 2026, Greedy Multi-Path Block Verification",
            "pick a path (greedy per position: best token by p/q present, or the first path's), then block "
            "verification of the picked path against its own law",
        ),
        TreeRuleInfo(
            "spectr", True, "i.i.d. draws from q at the node (a count k fixed before drawing)", True, {},
            "Sun et al. 2023, SpecTr (k-sequential selection)",
            "accept x iff u < p(x) / (rho q(x)), rho the smallest feasible in [1, k]; emit from "
            "norm(p - c min(q, p / rho))",
        ),
        TreeRuleInfo(
            "spechub", True, "a hub pair (x1 ~ q, then argmax q, or a draw from q without it when x1 is the argmax), "
            "then draws without replacement", True, {}, "Sun et al. 2024, SpecHub",
            "accept the non-hub child y iff u < p(y) / r(y), r = q / (1 - q(hub)); else the hub iff u < p(hub) / A; "
            "later children by rrs",
        ),
    ]
}


_USER_TREE_RULES: dict[str, TreeRuleInfo] = {}


def is_tree_rule(name: str) -> bool:
    """Whether ``name`` is a tree rule, built-in or registered (``greedy`` and ``typical`` are
    chain rules too)."""
    return name in _TREE_RULES or name in _USER_TREE_RULES


def register_tree_rule(
    name: str,
    fn: TreeRuleFn,
    *,
    lossless: bool = False,
    children: str | tuple[str, ...] = (),
    needs_draft_logits: bool = True,
    description: str = "",
    overwrite: bool = False,
) -> TreeRuleInfo:
    """Register a tree verification rule written in plain PyTorch under ``name``.

    ``fn(target_probs, draft_probs, tree, *, uniforms, **options)`` receives the processed
    distributions at every node (the sampling settings applied, as the compiled rules read
    them), the :class:`~specdecode.trees.TokenTree` and the coins, and returns a
    :class:`~specdecode.trees.TreeVerifyOutput` or a ``(tokens, accepted_len,
    accepted_nodes)`` triple. Keyword parameters after ``uniforms`` are the rule's options
    (``verify_tree(..., name=value)``, ``generate(..., name=value)``).

    Shape:
        target_probs: ``[B, N, V]`` float64 — at node v, p of the token after v.
        draft_probs: ``[B, N, V]`` float64 or None — at node v, q its children were drawn from
            (None when ``needs_draft_logits`` is False).
        uniforms: ``[B, N]`` float64 in [0, 1) — column ``c > 0`` node c's acceptance coin,
            column 0 the emitted token's inverse-CDF coin.
        returns: tokens ``[B, D+1]`` int64 (the accepted path's tokens, one emitted token in
            ``[0, V)``, then -1), accepted_len ``[B]`` int64, accepted_nodes ``[B, D+1]`` int64
            (0, the accepted nodes, each a child of the one before, then -1); ``D =
            tree.max_depth``.

    Every output is checked (:func:`specdecode.rule_checks.check_tree_output`): an error names
    the rule and the field. ``lossless`` is your claim for trees whose children are drafted by
    ``children`` (one of ``deterministic``, ``iid``, ``without_replacement``, ``hub``, or a
    tuple of them); ``generate`` refuses the rule on trees drafted otherwise, as it does for
    built-in rules. Prove the claim with :func:`specdecode.testing.exact_tree_test`.
    """
    if not isinstance(name, str) or not name:
        raise TypeError(f"name: expected a non-empty str, got {name!r}")
    if not callable(fn):
        raise TypeError(f"fn: expected a callable tree rule, got {type(fn).__name__}")
    if name in _TREE_RULES:
        raise ValueError(f"name: {name!r} is a built-in tree rule and cannot be replaced")
    if name in _USER_TREE_RULES and not overwrite:
        raise ValueError(f"name: a tree rule named {name!r} is already registered (pass overwrite=True)")
    schemes = (children,) if isinstance(children, str) else tuple(children)
    unknown = [c for c in schemes if c not in SCHEMES]
    if unknown or not isinstance(children, (str, tuple, list)):
        raise ValueError(f"children: expected a children scheme ({', '.join(SCHEMES)}) or a tuple of them, "
                         f"got {children!r}")
    if lossless and not schemes:
        raise ValueError("children: a lossless tree rule is lossless for some drafting scheme; name it "
                         f"(one of {', '.join(SCHEMES)})")
    options = declared_options(fn, ("target_probs", "draft_probs", "tree"), ("uniforms",))
    drafting = " or ".join(schemes) if schemes else "any"
    info = TreeRuleInfo(name, bool(lossless), drafting, bool(needs_draft_logits), options, "user rule", description,
                        compiled=False, builtin=False, fn=fn, children=schemes)
    _USER_TREE_RULES[name] = info
    return info


def unregister_tree_rule(name: str) -> None:
    """Remove a tree rule registered with :func:`register_tree_rule`."""
    if name not in _USER_TREE_RULES:
        raise ValueError(f"name: no user tree rule named {name!r}")
    del _USER_TREE_RULES[name]


#: Children schemes (see :mod:`specdecode.trees.builders`) each lossless tree rule is exact for.
LOSSLESS_CHILDREN = {
    "specinfer": ("iid",), "rrs": ("without_replacement",), "deterministic": ("deterministic",),
    "traversal": ("without_replacement",), "traversal_iid": ("iid",), "gbv": ("iid",), "spectr": ("iid",),
    "spechub": ("hub",),
}


def lossless_children(name: str) -> tuple[str, ...] | None:
    """The children schemes tree rule ``name`` is lossless for (None: it does not care, being
    lossy or greedy)."""
    info = _USER_TREE_RULES.get(name)
    if info is not None:
        return info.children if info.lossless else None
    return LOSSLESS_CHILDREN.get(name)


def list_tree_rules() -> list[TreeRuleInfo]:
    """Every tree rule: the built-in ones in a fixed order, then user rules in registration order."""
    return list(_TREE_RULES.values()) + list(_USER_TREE_RULES.values())


def get_tree_rule(name: str) -> TreeRuleInfo:
    """The entry for ``name``; ``ValueError`` listing the tree rules otherwise."""
    if not isinstance(name, str):
        raise TypeError(f"rule: expected a tree rule name (str), got {type(name).__name__}")
    info = _TREE_RULES.get(name) or _USER_TREE_RULES.get(name)
    if info is None:
        known = ", ".join(r.name for r in list_tree_rules())
        raise ValueError(f"rule: unknown tree rule {name!r}; tree rules: {known} (a chain rule's name is refused "
                         "here: register a tree rule with specdecode.trees.register_tree_rule)")
    return info


def tree_rule_params(info: TreeRuleInfo, options: dict[str, Any]) -> list[float]:
    """Check a rule's keyword options and pack them as the op's ``rule_params`` (a user rule
    takes its options as keywords: nothing to pack)."""
    if not info.builtin:
        return []
    unknown = sorted(set(options) - set(info.options))
    if unknown:
        allowed = ", ".join(info.options) or "none"
        raise TypeError(f"tree rule {info.name!r} got unexpected option(s) {unknown}; its options: {allowed}")
    values = {**info.options, **options}
    if info.name == "typical":
        epsilon, delta = float(values["epsilon"]), float(values["delta"])
        if not epsilon >= 0.0:
            raise ValueError(f"epsilon: expected a value >= 0, got {values['epsilon']!r}")
        if not delta >= 0.0:
            raise ValueError(f"delta: expected a value >= 0, got {values['delta']!r}")
        if not isinstance(values["sample_correction"], bool):
            raise TypeError(f"sample_correction: expected a bool, got {values['sample_correction']!r}")
        return [epsilon, delta, 1.0 if values["sample_correction"] else 0.0]
    return []
