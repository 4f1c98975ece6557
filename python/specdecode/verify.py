"""Public verification API: ``verify`` (from probabilities) and ``verify_logits`` (from raw
logits, with standardized sampling inside the compiled op)."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from specdecode import reference
from specdecode._ops import ops
from specdecode.reference import VerifyOutput
from specdecode.rule_checks import check_chain_output
from specdecode.rules import RuleInfo, builtin_rule_params, get_rule
from specdecode.sampling import SamplingParams, as_sampling_params

_FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)
# How far a probability row may sum from 1 before verify() calls it bad input.
_SUM_TOLERANCE = {torch.float64: 1e-6, torch.float32: 1e-4, torch.float16: 2e-2, torch.bfloat16: 2e-2}


def _check_tensor(name: str, value: Any, ndim: int, shape_text: str) -> Tensor:
    if not isinstance(value, Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor of shape {shape_text}, got {type(value).__name__}")
    if value.dim() != ndim:
        raise ValueError(f"{name}: expected shape {shape_text}, got {tuple(value.shape)}")
    return value


def _check_dist_tensor(name: str, value: Any, shape_text: str) -> Tensor:
    value = _check_tensor(name, value, 3, shape_text)
    if value.dtype not in _FLOAT_DTYPES:
        raise TypeError(f"{name}: expected float32, float16 or bfloat16 (or float64), got {value.dtype}")
    return value


def _prepare_common(
    target_name: str,
    target: Tensor,
    draft_name: str,
    draft: Tensor | None,
    draft_tokens: Tensor,
    num_draft_tokens: Tensor | None,
    generator: torch.Generator | None,
    uniforms: Tensor | None,
    info: RuleInfo,
    check_values: bool = True,
    philox: tuple[Tensor, Tensor] | None = None,
) -> tuple[Tensor, Tensor | None]:
    """Shape, dtype and device checks shared by verify and verify_logits. Returns the filled-in
    ``num_draft_tokens`` [B] int64 and ``uniforms`` [B, gamma+1] float64. Value checks need
    values: on the meta device (shapes only) they are skipped."""
    _check_dist_tensor(target_name, target, "[B, gamma+1, V]")
    _check_tensor("draft_tokens", draft_tokens, 2, "[B, gamma]")
    if draft_tokens.dtype != torch.int64:
        raise TypeError(f"draft_tokens: expected int64, got {draft_tokens.dtype}")
    B, gamma = draft_tokens.shape
    V = target.shape[2]
    device = target.device
    if gamma < 1:
        raise ValueError(f"draft_tokens: expected shape [B, gamma] with gamma >= 1, got {tuple(draft_tokens.shape)}")
    if V < 1:
        raise ValueError(f"{target_name}: the vocabulary dimension must be >= 1, got {tuple(target.shape)}")
    if tuple(target.shape[:2]) != (B, gamma + 1):
        raise ValueError(
            f"{target_name}: expected shape [B, gamma+1, V] = [{B}, {gamma + 1}, V] "
            f"(from draft_tokens [{B}, {gamma}]), got {tuple(target.shape)}"
        )
    if draft_tokens.device != device:
        raise ValueError(f"draft_tokens: expected device {device} (that of {target_name}), got {draft_tokens.device}")
    check_values = check_values and _has_values(target)
    if draft is None:
        if info.needs_draft_probs:
            raise ValueError(f"{draft_name}: rule {info.name!r} needs the draft's distributions, shape [B, gamma, V]")
    else:
        _check_dist_tensor(draft_name, draft, "[B, gamma, V]")
        if tuple(draft.shape) != (B, gamma, V):
            raise ValueError(
                f"{draft_name}: expected shape [B, gamma, V] = [{B}, {gamma}, {V}], got {tuple(draft.shape)}"
                + (" (the vocabulary sizes of target and draft differ)" if draft.shape[2] != V else "")
            )
        if draft.dtype != target.dtype:
            raise TypeError(f"{draft_name}: expected dtype {target.dtype} (that of {target_name}), got {draft.dtype}")
        if draft.device != device:
            raise ValueError(f"{draft_name}: expected device {device} (that of {target_name}), got {draft.device}")

    if num_draft_tokens is None:
        num_draft_tokens = torch.full((B,), gamma, dtype=torch.int64, device=device)
    else:
        _check_tensor("num_draft_tokens", num_draft_tokens, 1, f"[B] = [{B}]")
        if num_draft_tokens.shape[0] != B:
            raise ValueError(f"num_draft_tokens: expected shape [B] = [{B}], got {tuple(num_draft_tokens.shape)}")
        if num_draft_tokens.dtype != torch.int64:
            raise TypeError(f"num_draft_tokens: expected int64, got {num_draft_tokens.dtype}")
        if num_draft_tokens.device != device:
            raise ValueError(f"num_draft_tokens: expected device {device}, got {num_draft_tokens.device}")
        if check_values and bool(((num_draft_tokens < 0) | (num_draft_tokens > gamma)).any()):
            raise ValueError(f"num_draft_tokens: every entry must lie in [0, gamma] = [0, {gamma}]")

    # The compiled ops check these too (ValueError naming the row); checking here first gives
    # the friendlier message at the cost of a few small tensor ops.
    if check_values:
        used = torch.arange(gamma, device=device)[None, :] < num_draft_tokens[:, None]
        if bool((used & ((draft_tokens < 0) | (draft_tokens >= V))).any()):
            raise ValueError(f"draft_tokens: every used draft token must lie in [0, V) = [0, {V})")

    if philox is not None:
        if uniforms is not None or generator is not None:
            raise ValueError("philox_seed / philox_offset: pass them instead of uniforms or generator, not with them")
        if not info.builtin:
            raise ValueError(f"philox_seed: rule {info.name!r} is a Python rule; pass uniforms or a generator")
        return num_draft_tokens, None  # the op draws its own coins
    if generator is not None:
        if not isinstance(generator, torch.Generator):
            raise TypeError(f"generator: expected a torch.Generator or None, got {type(generator).__name__}")
        if generator.device.type != device.type and device.type != "meta":
            raise ValueError(f"generator: expected a generator on {device.type} (the inputs' device), "
                             f"got one on {generator.device}")
    if uniforms is None:
        uniforms = torch.rand((B, gamma + 1), dtype=torch.float64, device=device, generator=generator)
    else:
        if generator is not None:
            raise ValueError("uniforms: pass either generator or uniforms, not both")
        _check_tensor("uniforms", uniforms, 2, f"[B, gamma+1] = [{B}, {gamma + 1}]")
        if tuple(uniforms.shape) != (B, gamma + 1):
            raise ValueError(f"uniforms: expected shape [B, gamma+1] = [{B}, {gamma + 1}], got {tuple(uniforms.shape)}")
        if uniforms.dtype not in (torch.float32, torch.float64):
            raise TypeError(f"uniforms: expected float64 (or float32), got {uniforms.dtype}")
        if uniforms.device != device:
            raise ValueError(f"uniforms: expected device {device}, got {uniforms.device}")
        uniforms = uniforms.to(torch.float64)
        if _has_values(uniforms) and bool(((uniforms < 0) | (uniforms >= 1) | uniforms.isnan()).any()):
            raise ValueError("uniforms: every value must lie in [0, 1)")
    return num_draft_tokens, uniforms


def _philox_pair(philox_seed: Tensor | None, philox_offset: Tensor | None) -> tuple[Tensor, Tensor] | None:
    if philox_seed is None and philox_offset is None:
        return None
    if philox_seed is None or philox_offset is None:
        missing = "philox_seed" if philox_seed is None else "philox_offset"
        raise ValueError(f"{missing}: philox_seed and philox_offset go together (one-element int64 tensors)")
    for name, value in (("philox_seed", philox_seed), ("philox_offset", philox_offset)):
        if not isinstance(value, Tensor):
            raise TypeError(f"{name}: expected a one-element int64 tensor, got {type(value).__name__}")
    return philox_seed, philox_offset


def _has_values(tensor: Tensor) -> bool:
    """False for meta tensors, which carry shapes and dtypes but no values to check."""
    return tensor.device.type != "meta"


def _check_probabilities(name: str, probs: Tensor) -> None:
    if probs.numel() == 0 or not _has_values(probs):
        return
    if not bool(torch.isfinite(probs).all()):
        raise ValueError(f"{name}: holds NaN or infinite entries")
    if bool((probs < 0).any()):
        raise ValueError(f"{name}: holds negative probabilities")
    sums = probs.double().sum(-1)
    tolerance = _SUM_TOLERANCE[probs.dtype]
    worst = float((sums - 1.0).abs().max())
    if worst > tolerance:
        raise ValueError(f"{name}: every row must sum to 1 (largest deviation {worst:.3g} > {tolerance:g})")


def verify(
    target_probs: Tensor,
    draft_probs: Tensor | None,
    draft_tokens: Tensor,
    *,
    rule: str = "token",
    num_draft_tokens: Tensor | None = None,
    generator: torch.Generator | None = None,
    uniforms: Tensor | None = None,
    philox_seed: Tensor | None = None,
    philox_offset: Tensor | None = None,
    validate: bool = True,
    **rule_options: Any,
) -> VerifyOutput:
    """Verify drafted tokens against the target's distributions with one rule.

    Shape:
        target_probs: ``[B, gamma+1, V]`` float32 / float16 / bfloat16 — ``p_1..p_{gamma+1}``.
        draft_probs: ``[B, gamma, V]``, same dtype — ``q_1..q_gamma``; None for rules that do
            not read it (greedy, typical, top_beta).
        draft_tokens: ``[B, gamma]`` int64 — ``x_1..x_gamma``, ``x_i ~ q_i``.
        num_draft_tokens: ``[B]`` int64 or None — row ``b`` uses only its first
            ``num_draft_tokens[b]`` drafts (0..gamma); None means all gamma.
        uniforms: ``[B, gamma+1]`` float64 in [0, 1) or None — column ``i < gamma`` is the
            acceptance coin of draft ``i``, column ``gamma`` the emitted token's inverse-CDF
            coin. None draws them from ``generator`` (or torch's default generator).
        returns: ``VerifyOutput(tokens [B, gamma+1] int64, accepted_len [B] int64)``.

    ``rule`` is a name from :func:`specdecode.list_rules`; ``rule_options`` are its options
    (typical: ``epsilon``, ``delta``, ``sample_correction``; top_beta: ``beta``, ``tolerance``).
    ``philox_seed`` / ``philox_offset`` (one-element int64 tensors on the inputs' device, instead
    of ``uniforms``/``generator``) make the op draw its coins from Philox4x32-10 itself, reading
    seed and offset from memory: on CUDA such a call can be captured in a CUDA graph (advance
    the offset between calls). The coins equal those documented in ``csrc/kernels/philox.h``.
    With ``validate`` (default) the probabilities are checked (finite, non-negative, rows sum
    to 1, drafted tokens have ``q > 0``), at the cost of one extra pass over them. Meta tensors
    (shapes without values) skip every value check and give meta outputs of the right shapes.

    Example:
        >>> p = torch.softmax(torch.randn(2, 4, 10), -1); q = torch.softmax(torch.randn(2, 3, 10), -1)
        >>> x = torch.multinomial(q.flatten(0, 1), 1).view(2, 3)
        >>> out = specdecode.verify(p, q, x, rule="block", generator=torch.Generator().manual_seed(0))
        >>> out.tokens.shape, out.accepted_len.shape
        (torch.Size([2, 4]), torch.Size([2]))
    """
    info = get_rule(rule)
    philox = _philox_pair(philox_seed, philox_offset)
    num_draft_tokens, uniforms = _prepare_common(
        "target_probs", target_probs, "draft_probs", draft_probs, draft_tokens, num_draft_tokens,
        generator, uniforms, info, philox=philox,
    )
    B, gamma = draft_tokens.shape
    if validate:
        _check_probabilities("target_probs", target_probs)
        if draft_probs is not None:
            _check_probabilities("draft_probs", draft_probs)
            if info.needs_draft_probs and _has_values(draft_probs):
                used = torch.arange(gamma, device=draft_tokens.device)[None, :] < num_draft_tokens[:, None]
                q_x = torch.gather(draft_probs, 2, draft_tokens.clamp(0, draft_probs.shape[2] - 1)[..., None])[..., 0]
                bad = used & (q_x <= 0)
                if bool(bad.any()):
                    b, i = (int(v) for v in torch.nonzero(bad)[0])
                    raise ValueError(
                        f"draft_probs: draft_probs[{b}, {i}, draft_tokens[{b}, {i}]] is 0, but draft tokens are "
                        "sampled from draft_probs, so a drafted token must have probability > 0"
                    )
    if not info.builtin:
        result = info.fn(target_probs, draft_probs, draft_tokens, num_draft_tokens=num_draft_tokens,
                         uniforms=uniforms, **rule_options)
        return check_chain_output(result, info.name, draft_tokens, num_draft_tokens, target_probs.shape[2])
    params = builtin_rule_params(info, rule_options)
    draft = draft_probs if info.needs_draft_probs else None
    if philox is not None:
        tokens, accepted_len = ops.verify_probs_philox(
            target_probs, draft, draft_tokens, num_draft_tokens, *philox, info.name, params)
    else:
        tokens, accepted_len = ops.verify_probs(
            target_probs, draft, draft_tokens, num_draft_tokens, uniforms, info.name, params)
    return VerifyOutput(tokens, accepted_len)


def verify_logits(
    target_logits: Tensor,
    draft_logits: Tensor | None,
    draft_tokens: Tensor,
    *,
    temperature: float | None = None,
    top_k: int | None = None,
    top_p: float | None = None,
    min_p: float | None = None,
    sampling: SamplingParams | None = None,
    rule: str = "token",
    num_draft_tokens: Tensor | None = None,
    generator: torch.Generator | None = None,
    uniforms: Tensor | None = None,
    philox_seed: Tensor | None = None,
    philox_offset: Tensor | None = None,
    **rule_options: Any,
) -> VerifyOutput:
    """Verify from raw logits, applying standardized sampling inside the compiled op.

    The same temperature, top-k, top-p and min-p (given one by one, or together as
    ``sampling=SamplingParams(...)``; defaults: temperature 1, no filters) are applied to
    target and draft logits (in that order, see :mod:`specdecode.sampling`), each logit row is read once,
    and rows after the first rejection are not read by token verification. ``temperature=0``
    is greedy decoding: every built-in rule becomes the greedy rule. A drafted token that the
    draft's processed distribution gives probability 0 (only possible if it was drafted with
    other settings) counts as accepted iff the target gives it positive probability.

    Shape:
        target_logits: ``[B, gamma+1, V]`` float32 / float16 / bfloat16.
        draft_logits: ``[B, gamma, V]`` same dtype, or None for greedy / typical / top_beta.
        draft_tokens, num_draft_tokens, uniforms, philox_seed, philox_offset, returns: as
            :func:`verify`.

    NaN or ``+inf`` logits in a row the rule reads raise ``ValueError`` (``-inf`` masks a
    token). Probabilities are computed in float32 with float64 sums, so results match
    :func:`specdecode.reference.verify_logits_reference` except where a coin lies within about
    1e-6 (relative) of a decision boundary.
    """
    sampling = as_sampling_params(sampling, temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p)
    info = get_rule(rule)
    params = builtin_rule_params(info, rule_options) if info.builtin else []
    if sampling.is_greedy and info.builtin:
        info, params = get_rule("greedy"), []
    philox = _philox_pair(philox_seed, philox_offset)
    num_draft_tokens, uniforms = _prepare_common(
        "target_logits", target_logits, "draft_logits", draft_logits, draft_tokens, num_draft_tokens,
        generator, uniforms, info, check_values=False, philox=philox,
    )
    if not info.builtin:
        target_probs = reference.process_logits(target_logits, *sampling.op_args()).to(target_logits.dtype)
        draft_probs = None
        if draft_logits is not None:
            draft_probs = reference.process_logits(draft_logits, *sampling.op_args()).to(draft_logits.dtype)
        result = info.fn(target_probs, draft_probs, draft_tokens, num_draft_tokens=num_draft_tokens,
                         uniforms=uniforms, **rule_options)
        return check_chain_output(result, info.name, draft_tokens, num_draft_tokens, target_logits.shape[2])
    draft = draft_logits if info.needs_draft_probs else None
    if philox is not None:
        tokens, accepted_len = ops.verify_logits_philox(
            target_logits, draft, draft_tokens, num_draft_tokens, *philox, *sampling.op_args(), info.name, params)
    else:
        tokens, accepted_len = ops.verify_logits(
            target_logits, draft, draft_tokens, num_draft_tokens, uniforms, *sampling.op_args(), info.name, params)
    return VerifyOutput(tokens, accepted_len)
