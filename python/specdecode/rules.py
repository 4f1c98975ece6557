"""The rule registry: built-in compiled rules, and rules a researcher writes in plain PyTorch.

>>> import specdecode
>>> def always_reject(target_probs, draft_probs, draft_tokens, *, num_draft_tokens, uniforms):
...     B, gamma = draft_tokens.shape
...     tokens = torch.full((B, gamma + 1), -1, dtype=torch.int64)
...     tokens[:, 0] = target_probs[:, 0].argmax(-1)
...     return specdecode.VerifyOutput(tokens, torch.zeros(B, dtype=torch.int64))
>>> specdecode.register_rule("always_reject", always_reject, lossless=False, needs_draft_probs=False)
>>> [r.name for r in specdecode.list_rules()][-1]
'always_reject'

A user rule is then accepted by name everywhere a rule is: ``verify``, ``verify_logits``
(which hands it the processed probabilities) and the generate loop.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from typing import Any, Callable

RuleFn = Callable[..., Any]


@dataclass(frozen=True)
class RuleInfo:
    """What the registry knows about one rule."""

    name: str
    lossless: bool
    builtin: bool
    needs_draft_probs: bool
    options: dict[str, Any] = field(default_factory=dict)
    paper: str = ""
    description: str = ""
    fn: RuleFn | None = None  # None for built-in (compiled) rules

    def __str__(self) -> str:
        kind = "built-in" if self.builtin else "user"
        loss = "lossless" if self.lossless else "lossy"
        return f"{self.name:10s} {kind:8s} {loss:8s} {self.paper}"


_BUILTIN_RULES: dict[str, RuleInfo] = {
    r.name: r
    for r in [
        RuleInfo("token", True, True, True, {}, "Leviathan et al. 2022; Chen et al. 2023",
                 "accept x_i with probability min(1, p/q); resample from (p - q)+"),
        RuleInfo("block", True, True, True, {}, "Sun et al. 2024, Block Verification",
                 "the longest sub-block accepted by its own coin; optimal among lossless rules"),
        RuleInfo("greedy", True, True, False, {}, "exact at temperature 0",
                 "accept while x_i == argmax p_i"),
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
    receives what ``specdecode.verify`` receives (``num_draft_tokens`` and ``uniforms`` always
    filled in, see :mod:`specdecode.reference` for the uniforms layout) and returns a
    ``VerifyOutput`` or a ``(tokens, accepted_len)`` pair.

    Shape:
        target_probs: ``[B, gamma+1, V]``; draft_probs: ``[B, gamma, V]`` (None when
        ``needs_draft_probs`` is False and none was given); draft_tokens: ``[B, gamma]`` int64;
        num_draft_tokens: ``[B]`` int64; uniforms: ``[B, gamma+1]`` float64;
        returned tokens ``[B, gamma+1]`` int64 (-1 padded), accepted_len ``[B]`` int64.

    ``lossless`` is your claim, shown by :func:`list_rules`; prove it with
    ``specdecode.testing``-style exact tests before relying on it.
    """
    if not isinstance(name, str) or not name:
        raise TypeError(f"name: expected a non-empty str, got {name!r}")
    if not callable(fn):
        raise TypeError(f"fn: expected a callable rule, got {type(fn).__name__}")
    if name in _BUILTIN_RULES:
        raise ValueError(f"name: {name!r} is a built-in rule and cannot be replaced")
    if name in _USER_RULES and not overwrite:
        raise ValueError(f"name: a rule named {name!r} is already registered (pass overwrite=True)")
    info = RuleInfo(name, bool(lossless), False, bool(needs_draft_probs), {}, "user rule", description, fn)
    _USER_RULES[name] = info
    return info


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
