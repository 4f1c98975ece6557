"""The rule registry: built-in compiled rules, and rules a researcher writes in plain PyTorch.

A chain rule is a function of what :func:`specdecode.verify` receives; registered under a
name, it is accepted everywhere a rule is: ``verify``, ``verify_logits`` (which hands it the
processed probabilities) and ``generate`` (its keyword options are generate's extra keywords).
Its output is checked on every call (:mod:`specdecode.rule_checks`): a malformed one raises an
error naming the rule and the field before anything reads it. :func:`specdecode.testing.exact_test`
tells whether a rule is lossless; tree rules have their own registry,
:func:`specdecode.trees.register_tree_rule`. The page ``docs/rules.md`` walks through both.

>>> import torch, specdecode
>>> from specdecode.reference import sample_inverse_cdf
>>> def argmax_or_reject(target_probs, draft_probs, draft_tokens, *, num_draft_tokens, uniforms, margin=0.0):
...     # accept while the draft is the target's argmax by ``margin``; emit a draw from p
...     B, gamma = draft_tokens.shape
...     tokens = torch.full((B, gamma + 1), -1, dtype=torch.int64)
...     accepted = torch.zeros(B, dtype=torch.int64)
...     for b in range(B):
...         i = 0
...         while i < int(num_draft_tokens[b]):
...             p = target_probs[b, i]
...             top2 = p.topk(2).values if p.numel() > 1 else p.topk(1).values.repeat(2)
...             if int(p.argmax()) != int(draft_tokens[b, i]) or float(top2[0] - top2[1]) < margin:
...                 break
...             tokens[b, i] = draft_tokens[b, i]
...             i += 1
...         tokens[b, i] = sample_inverse_cdf(target_probs[b, i].double(), float(uniforms[b, gamma]))
...         accepted[b] = i
...     return specdecode.VerifyOutput(tokens, accepted)
>>> info = specdecode.register_rule("argmax_or_reject", argmax_or_reject, lossless=False, needs_draft_probs=False)
>>> print(info)
argmax_or_reject user     lossy    options: margin=0.0
>>> p = torch.softmax(torch.randn(2, 4, 10), -1)
>>> out = specdecode.verify(p, None, p[:, :3].argmax(-1), rule="argmax_or_reject", margin=0.01)
>>> out.tokens.shape
torch.Size([2, 4])
>>> specdecode.unregister_rule("argmax_or_reject")
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from typing import Any, Callable

RuleFn = Callable[..., Any]


@dataclass(frozen=True)
class RuleInfo:
    """What the registry knows about one rule.

    ``lossless`` is True only for a rule whose output has the target's distribution at every
    temperature; ``lossless_when`` says it in words (``"always"``, ``"temperature 0 only"``
    for ``greedy``, ``"never"``; a user rule's is its author's claim). ``options`` are the
    rule's keyword options with their defaults (a user rule's keyword parameters;
    ``"required"`` for one without a default).
    """

    name: str
    lossless: bool
    builtin: bool
    needs_draft_probs: bool
    options: dict[str, Any] = field(default_factory=dict)
    paper: str = ""
    description: str = ""
    fn: RuleFn | None = None  # None for built-in (compiled) rules
    lossless_when: str = ""

    def __post_init__(self) -> None:
        if not self.lossless_when:
            object.__setattr__(self, "lossless_when", "always" if self.lossless else "never")

    def __str__(self) -> str:
        kind = "built-in" if self.builtin else "user"
        loss = {"always": "lossless", "never": "lossy"}.get(self.lossless_when, "T=0 only")
        options = ", ".join(f"{k}={v!r}" if v != "required" else k for k, v in self.options.items())
        if self.builtin:
            return f"{self.name:10s} {kind:8s} {loss:8s} {self.paper}".rstrip()
        return f"{self.name:10s} {kind:8s} {loss:8s} options: {options or 'none'} {self.description}".rstrip()


_BUILTIN_RULES: dict[str, RuleInfo] = {
    r.name: r
    for r in [
        RuleInfo("token", True, True, True, {}, "Leviathan et al. 2022; Chen et al. 2023",
                 "accept x_i with probability min(1, p/q); resample from (p - q)+"),
        RuleInfo("block", True, True, True, {}, "Sun et al. 2024, Block Verification",
                 "the longest sub-block accepted by its own coin; optimal among lossless rules"),
        RuleInfo("greedy", False, True, False, {}, "exact at temperature 0",
                 "accept while x_i == argmax p_i", lossless_when="temperature 0 only"),
        RuleInfo("typical", False, True, False,
                 {"epsilon": 0.09, "delta": 0.3, "sample_correction": False},
                 "Cai et al. 2024, Medusa", "accept while p(x) > min(epsilon, delta exp(-H(p)))"),
        RuleInfo("top_beta", False, True, False, {"beta": 3, "tolerance": 1.0},
                 "Xia et al. 2022, SpecDec", "accept x among the beta most likely within a log-prob tolerance"),
    ]
}
_USER_RULES: dict[str, RuleInfo] = {}


def register_rule(
    name: str,
    fn: RuleFn,
    *,
    lossless: bool = False,
    needs_draft_probs: bool = True,
    description: str = "",
    overwrite: bool = False,
) -> RuleInfo:
    """Register a verification rule written in plain PyTorch under ``name``.

    ``fn(target_probs, draft_probs, draft_tokens, *, num_draft_tokens, uniforms, **options)``
    receives what :func:`specdecode.verify` receives, with ``num_draft_tokens`` and ``uniforms``
    always filled in, and returns a ``VerifyOutput`` or a ``(tokens, accepted_len)`` pair. The
    coins: ``uniforms[b, i]`` (``i < num_draft_tokens[b]``) is draft i's acceptance coin,
    ``uniforms[b, gamma]`` the emitted token's inverse-CDF coin; sampling with them through
    :func:`specdecode.reference.sample_inverse_cdf` and
    :func:`specdecode.reference.sample_residual` draws exactly as the compiled rules do (the
    same seed then gives the same tokens). Keyword parameters after ``uniforms`` are the
    rule's options, listed by :func:`list_rules` and passed from ``verify(..., name=value)`` or
    ``generate(..., name=value)``.

    Shape:
        target_probs: ``[B, gamma+1, V]``; draft_probs: ``[B, gamma, V]`` (None when
        ``needs_draft_probs`` is False and none was given); draft_tokens: ``[B, gamma]`` int64;
        num_draft_tokens: ``[B]`` int64; uniforms: ``[B, gamma+1]`` float64;
        returned tokens ``[B, gamma+1]`` int64 (accepted drafts, one emitted token in
        ``[0, V)``, then -1), accepted_len ``[B]`` int64 in ``[0, num_draft_tokens]``.

    Every output is checked (:func:`specdecode.rule_checks.check_chain_output`): an error names
    the rule and the field. ``lossless`` is your claim, shown by :func:`list_rules`; prove it
    with :func:`specdecode.testing.exact_test` before relying on it. ``TypeError`` when ``fn``
    cannot take the arguments above.
    """
    if not isinstance(name, str) or not name:
        raise TypeError(f"name: expected a non-empty str, got {name!r}")
    if not callable(fn):
        raise TypeError(f"fn: expected a callable rule, got {type(fn).__name__}")
    if name in _BUILTIN_RULES:
        raise ValueError(f"name: {name!r} is a built-in rule and cannot be replaced")
    if name in _USER_RULES and not overwrite:
        raise ValueError(f"name: a rule named {name!r} is already registered (pass overwrite=True)")
    options = declared_options(fn, ("target_probs", "draft_probs", "draft_tokens"), ("num_draft_tokens", "uniforms"))
    info = RuleInfo(name, bool(lossless), False, bool(needs_draft_probs), options, "user rule", description, fn)
    _USER_RULES[name] = info
    return info


def declared_options(fn: RuleFn, positional: tuple[str, ...], keywords: tuple[str, ...]) -> dict[str, Any]:
    """The options a user rule declares: its keyword parameters besides the call's own, each
    with its default (``"required"`` without one). ``TypeError`` naming ``fn`` when it cannot
    be called with ``len(positional)`` positional arguments and the ``keywords``."""
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):
        return {}
    try:
        signature.bind_partial(*positional, **{k: None for k in keywords})
    except TypeError as error:
        call = ", ".join(positional) + ", *, " + ", ".join(keywords)
        raise TypeError(f"fn: a rule is called as fn({call}, **options); {error}") from None
    call = set(positional) | set(keywords)
    options = {}
    for p in signature.parameters.values():
        if p.name in call or p.kind not in (inspect.Parameter.KEYWORD_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD):
            continue
        options[p.name] = "required" if p.default is inspect.Parameter.empty else p.default
    return options


def unregister_rule(name: str) -> None:
    """Remove a user rule registered with :func:`register_rule`."""
    if name not in _USER_RULES:
        raise ValueError(f"name: no user rule named {name!r}")
    del _USER_RULES[name]


def list_rules() -> list[RuleInfo]:
    """Every rule usable by name: built-in first, then user rules in registration order."""
    return list(_BUILTIN_RULES.values()) + list(_USER_RULES.values())


def is_chain_rule(name: str) -> bool:
    """Whether ``name`` is a registered chain rule (built-in or user)."""
    return name in _BUILTIN_RULES or name in _USER_RULES


def get_rule(name: str) -> RuleInfo:
    """The registry entry for ``name``; ``ValueError`` listing the known rules otherwise."""
    if not isinstance(name, str):
        raise TypeError(f"rule: expected a rule name (str), got {type(name).__name__}")
    info = _BUILTIN_RULES.get(name) or _USER_RULES.get(name)
    if info is None:
        known = ", ".join(r.name for r in list_rules())
        raise ValueError(f"rule: unknown rule {name!r}; known rules: {known}")
    return info


_RULE_CALL_ARGUMENTS = {"target_probs", "draft_probs", "draft_tokens", "num_draft_tokens", "uniforms"}


def rule_option_names(info: RuleInfo) -> frozenset[str] | None:
    """The option names a rule declares: a built-in rule's documented options; a user rule's
    extra keyword parameters (None when its function takes ``**kwargs``: anything goes)."""
    if info.builtin:
        return frozenset(info.options)
    try:
        parameters = inspect.signature(info.fn).parameters.values()
    except (TypeError, ValueError):
        return None
    names = set()
    for p in parameters:
        if p.kind is inspect.Parameter.VAR_KEYWORD:
            return None
        if p.kind in (inspect.Parameter.KEYWORD_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD):
            names.add(p.name)
    return frozenset(names - _RULE_CALL_ARGUMENTS)


def builtin_rule_params(info: RuleInfo, options: dict[str, Any]) -> list[float]:
    """Check a built-in rule's keyword options and pack them as the op's ``rule_params``."""
    unknown = sorted(set(options) - set(info.options))
    if unknown:
        allowed = ", ".join(info.options) or "none"
        raise TypeError(f"rule {info.name!r} got unexpected option(s) {unknown}; its options: {allowed}")
    values = {**info.options, **options}
    if info.name == "typical":
        return [float(values["epsilon"]), float(values["delta"]), 1.0 if values["sample_correction"] else 0.0]
    if info.name == "top_beta":
        beta = values["beta"]
        if isinstance(beta, bool) or not isinstance(beta, int) or beta < 1:
            raise ValueError(f"beta: expected an int >= 1, got {beta!r}")
        tolerance = float(values["tolerance"])
        if not tolerance >= 0.0:
            raise ValueError(f"tolerance: expected a value >= 0, got {tolerance!r}")
        return [float(beta), tolerance]
    return []
