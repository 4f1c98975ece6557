"""Verification of token trees from raw logits (compiled op ``verify_tree``).

>>> import torch, specdecode
>>> from specdecode.trees import TokenTree
>>> tree = TokenTree(torch.tensor([[5, 7, 8, 9]]), torch.tensor([[-1, 0, 0, 1]]), torch.tensor([4]))
>>> target_logits = torch.randn(1, 4, 50)    # p at every node (of the token after it)
>>> out = specdecode.verify_tree(target_logits, None, tree, rule="greedy")
>>> out.tokens.shape, out.accepted_nodes.shape          # [B, max_depth + 1]
(torch.Size([1, 3]), torch.Size([1, 3]))
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from specdecode._ops import ops
from specdecode.rule_checks import check_tree_output
from specdecode.sampling import SamplingParams, as_sampling_params, processed_probs
from specdecode.trees.output import TreeVerifyOutput
from specdecode.trees.python_rules import is_python_rule, verify_tree_python
from specdecode.trees.rules import TreeRuleInfo, get_tree_rule, tree_rule_params
from specdecode.trees.tree import TokenTree

_FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)


def _check_logits(name: str, value: Any, shape: tuple[int, int], device: torch.device) -> Tensor:
    B, N = shape
    if not isinstance(value, Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor of shape [B, N, V] = [{B}, {N}, V], got {type(value).__name__}")
    if value.dim() != 3 or tuple(value.shape[:2]) != (B, N):
        raise ValueError(f"{name}: expected shape [B, N, V] = [{B}, {N}, V] (from the tree), got {tuple(value.shape)}")
    if value.dtype not in _FLOAT_DTYPES:
        raise TypeError(f"{name}: expected float32, float16, bfloat16 or float64, got {value.dtype}")
    if value.device != device:
        raise ValueError(f"{name}: expected device {device} (that of the tree), got {value.device}")
    return value


def _tree_uniforms(B: int, N: int, device: torch.device, generator: torch.Generator | None,
                   uniforms: Tensor | None) -> Tensor:
    if uniforms is None:
        return torch.rand((B, N), dtype=torch.float64, device=device, generator=generator)
    if generator is not None:
        raise ValueError("uniforms: pass either generator or uniforms, not both")
    if not isinstance(uniforms, Tensor):
        raise TypeError(f"uniforms: expected a torch.Tensor of shape [B, N] = [{B}, {N}], got {type(uniforms).__name__}")
    if tuple(uniforms.shape) != (B, N):
        raise ValueError(f"uniforms: expected shape [B, N] = [{B}, {N}], got {tuple(uniforms.shape)}")
    if uniforms.dtype not in (torch.float32, torch.float64):
        raise TypeError(f"uniforms: expected float64 (or float32), got {uniforms.dtype}")
    if uniforms.device != device:
        raise ValueError(f"uniforms: expected device {device}, got {uniforms.device}")
    uniforms = uniforms.to(torch.float64)
    if bool(((uniforms < 0) | (uniforms >= 1) | uniforms.isnan()).any()):
        raise ValueError("uniforms: every value must lie in [0, 1)")
    return uniforms


def _check_backend(device: torch.device) -> None:
    """verify_tree has a CPU kernel, a CUDA one in CUDA builds (and a fake one); other devices
    need their own kernel."""
    if device.type in ("cpu", "meta"):
        return
    key = {"cuda": "CUDA"}.get(device.type, device.type.upper())
    if not torch._C._dispatch_has_kernel_for_dispatch_key("specdecode::verify_tree", key):
        raise NotImplementedError(
            f"verify_tree: no {device.type} kernel in this build; move the logits and the tree to the CPU "
            "(target_logits.cpu(), tree.to('cpu')) and the outputs back"
        )


def _probs(logits: Tensor, sampling: SamplingParams) -> Tensor:
    B, N, V = logits.shape
    return processed_probs(logits.reshape(B * N, V), sampling).view(B, N, V)


def _verify_user_rule(info: TreeRuleInfo, target_logits: Tensor, draft_logits: Tensor | None, tree: TokenTree,
                      sampling: SamplingParams, uniforms: Tensor, options: dict[str, Any]) -> TreeVerifyOutput:
    """Run a rule registered with :func:`~specdecode.trees.register_tree_rule` on the processed
    distributions and check what it returns.

    Shape:
        target_logits, draft_logits: ``[B, N, V]``; uniforms: ``[B, N]`` float64.
    """
    tree.validate()
    V = target_logits.shape[2]
    bad = (tree.tokens[:, 1:] < 0) | (tree.tokens[:, 1:] >= V)
    bad &= torch.arange(1, tree.max_nodes, device=tree.device)[None, :] < tree.num_nodes[:, None]
    if bool(bad.any()):
        raise ValueError(f"tree_tokens: every node token must lie in [0, V) = [0, {V})")
    p = _probs(target_logits, sampling)
    q = None if draft_logits is None else _probs(draft_logits, sampling)
    result = info.fn(p, q, tree, uniforms=uniforms, **options)
    checked = check_tree_output(result, info.name, tree.tokens, tree.parents, tree.num_nodes, tree.max_depth, V)
    return TreeVerifyOutput(*checked)


def verify_tree(
    target_logits: Tensor,
    draft_logits: Tensor | None,
    tree: TokenTree,
    *,
    rule: str,
    sampling: SamplingParams | None = None,
    temperature: float | None = None,
    top_k: int | None = None,
    top_p: float | None = None,
    min_p: float | None = None,
    generator: torch.Generator | None = None,
    uniforms: Tensor | None = None,
    philox_seed: Tensor | None = None,
    philox_offset: Tensor | None = None,
    **rule_options: Any,
) -> TreeVerifyOutput:
    """Verify a batch of token trees against the target's logits with one tree rule.

    Walk from the root: at node v the rule tries v's children in index order against ``p_v``
    (and ``q_v``), moves to the child it accepts, and stops by emitting one token when it
    accepts none or v is a leaf. ``rule`` is one of :func:`specdecode.trees.list_tree_rules`,
    each lossless only for its drafting scheme (the table says which). Logits are processed
    with ``sampling`` (or the ``temperature`` / ``top_k`` / ``top_p`` / ``min_p`` keywords) on
    target and draft alike, exactly as :func:`specdecode.verify_logits` does; temperature 0
    makes every rule the greedy walk.

    Shape:
        target_logits: ``[B, N, V]`` float32 / float16 / bfloat16 / float64 — at node v, the
            target's logits for the token that follows v.
        draft_logits: ``[B, N, V]`` same dtype, or None — at node v, the logits v's children
            were drafted from; needed by every rule that reads q (``specinfer``, ``rrs``,
            ``traversal``, ``traversal_iid``, ``gbv``, ``spectr``, ``spechub``) unless
            temperature is 0.
        tree: :class:`TokenTree` with ``[B, N]`` tensors on the logits' device.
        uniforms: ``[B, N]`` float64 in [0, 1) or None — column ``c > 0`` is node c's acceptance
            coin, column 0 the emitted token's inverse-CDF coin (a chain of k drafts as a tree
            uses the chain ops' ``[B, k+1]`` coins rolled right by one:
            ``torch.roll(chain_uniforms, 1, dims=1)``). None draws them from ``generator``.
        philox_seed, philox_offset: one-element int64 tensors instead of ``uniforms`` /
            ``generator``: coin (b, c) = ``philox_uniform(seed, offset, b, c)``.
        returns: :class:`TreeVerifyOutput` trimmed to ``D + 1`` columns, ``D = tree.max_depth``
            (one host synchronisation).

    ``rule_options``: ``typical`` takes ``epsilon``, ``delta``, ``sample_correction``; a rule
    registered with :func:`~specdecode.trees.register_tree_rule` gets them as keywords, with the
    processed distributions and the coins, and its output is checked (an error names the rule
    and the field). Bad trees
    (see :meth:`TokenTree.validate`), node tokens outside ``[0, V)``, repeated sibling tokens
    under ``rrs`` / ``deterministic`` / ``traversal``, and NaN / ``+inf`` logits in a row that is
    read raise ``ValueError`` naming the argument. The op runs on the CPU; other devices raise
    ``NotImplementedError`` until they have a kernel. A rule marked Python-only in
    :func:`list_tree_rules` (none now) would run in :mod:`specdecode.trees.python_rules` on the
    CPU (any device's tensors copied there), with the same coins, without ``philox_seed`` /
    ``philox_offset``. ``gbv`` refuses a tree that is not K paths of one length below the root
    (``ValueError`` naming ``parents``).
    """
    if not isinstance(tree, TokenTree):
        raise TypeError(f"tree: expected a specdecode.trees.TokenTree, got {type(tree).__name__}")
    params = as_sampling_params(sampling, temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p)
    info = get_tree_rule(rule)
    rule_params = tree_rule_params(info, rule_options)
    if params.is_greedy and info.builtin:
        info, rule_params = get_tree_rule("greedy"), []
    B, N = tree.batch_size, tree.max_nodes
    device = tree.device
    _check_logits("target_logits", target_logits, (B, N), device)
    _check_backend(device)
    if draft_logits is not None:
        _check_logits("draft_logits", draft_logits, (B, N), device)
        if draft_logits.shape[2] != target_logits.shape[2]:
            raise ValueError(
                f"draft_logits: expected shape [B, N, V] = [{B}, {N}, {target_logits.shape[2]}], got "
                f"{tuple(draft_logits.shape)} (the vocabulary sizes of target and draft differ)"
            )
        if draft_logits.dtype != target_logits.dtype:
            raise TypeError(f"draft_logits: expected dtype {target_logits.dtype} (that of target_logits), got {draft_logits.dtype}")
    elif info.needs_draft_logits:
        raise ValueError(f"draft_logits: tree rule {info.name!r} needs the draft's logits at every node, shape [B, N, V]")
    draft = draft_logits if info.needs_draft_logits else None

    if not info.builtin:
        if philox_seed is not None or philox_offset is not None:
            raise ValueError(f"philox_seed: tree rule {info.name!r} is a Python rule; pass uniforms or a generator")
        coins = _tree_uniforms(B, N, device, generator, uniforms)
        return _verify_user_rule(info, target_logits, draft, tree, params, coins, rule_options)
    if is_python_rule(info.name):
        if philox_seed is not None or philox_offset is not None:
            raise NotImplementedError(f"philox_seed / philox_offset: tree rule {info.name!r} runs in Python only; "
                                      "pass uniforms or generator")
        coins = _tree_uniforms(B, N, device, generator, uniforms)
        return verify_tree_python(target_logits, draft, tree, rule=info.name, sampling=params, uniforms=coins)
    if philox_seed is not None or philox_offset is not None:
        if philox_seed is None or philox_offset is None:
            missing = "philox_seed" if philox_seed is None else "philox_offset"
            raise ValueError(f"{missing}: philox_seed and philox_offset go together (one-element int64 tensors)")
        if uniforms is not None or generator is not None:
            raise ValueError("philox_seed / philox_offset: pass them instead of uniforms or generator, not with them")
        for name, value in (("philox_seed", philox_seed), ("philox_offset", philox_offset)):
            if not isinstance(value, Tensor):
                raise TypeError(f"{name}: expected a one-element int64 tensor, got {type(value).__name__}")
        tokens, accepted_len, accepted_nodes = ops.verify_tree_philox(
            target_logits, draft, tree.tokens, tree.parents, tree.num_nodes, philox_seed, philox_offset,
            *params.op_args(), info.name, rule_params)
    else:
        coins = _tree_uniforms(B, N, device, generator, uniforms)
        tokens, accepted_len, accepted_nodes = ops.verify_tree(
            target_logits, draft, tree.tokens, tree.parents, tree.num_nodes, coins, *params.op_args(), info.name,
            rule_params)
    width = tree.max_depth + 1  # the op validated the trees, so depth is meaningful
    return TreeVerifyOutput(tokens[:, :width].contiguous(), accepted_len, accepted_nodes[:, :width].contiguous())
