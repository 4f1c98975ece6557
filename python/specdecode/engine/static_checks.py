"""What the static decode path (:mod:`specdecode.engine.static_loop`) cannot do, refused up
front with a ``ValueError`` that names the argument and says what to use instead (mostly
``decode_path='eager'``): host work at every token (processors, stopping criteria, streamers),
changing shapes (adaptive schedules), Python rules, drafters without
:class:`~specdecode.drafters.StaticDrafter` (except host drafters of chains and tries,
:mod:`~specdecode.engine.host_drafts`), models spread over devices or ignoring custom 4D
attention masks, and CUDA graphs without CUDA or without the compiled kernels. Token trees are
checked by :func:`~specdecode.engine.static_tree.check_static_tree`: drafters without
:class:`~specdecode.drafters.StaticTreeDrafter`, builders that decide on the host, and tree
rules that are not lossless for the plan's children.
"""

from __future__ import annotations

from typing import Any

import torch

from specdecode.drafters.base import StaticDrafter
from specdecode.engine.host_drafts import host_drafts_tree, host_tree_plan, is_host_drafter
from specdecode.engine.schedules import ConstantSchedule, DraftSchedule
from specdecode.engine.settings import EngineSettings
from specdecode.engine.static_features import drafter_modules
from specdecode.engine.static_layouts import modules_of
from specdecode.engine.static_tree import TreeSetup, check_static_tree, drafts_tree
from specdecode.models import facts, kv_cache
from specdecode.rules import get_rule, is_chain_rule


def _has_cuda_kernel(op: str) -> bool:
    try:
        return bool(torch._C._dispatch_has_kernel_for_dispatch_key(f"specdecode::{op}", "CUDA"))
    except Exception:  # noqa: BLE001 - an unknown op or an old torch: no kernel
        return False


def _single_device(model: torch.nn.Module, name: str) -> torch.device:
    """The one device of ``model``'s parameters, or ``ValueError`` naming ``name`` (tensor
    parallelism, accelerate's dispatch, several devices). One walk over the modules, reading
    their own tables (it runs at every call: a 30-layer model has ~400 modules)."""
    devices = set()
    for module in modules_of(model):
        if vars(module).get("_hf_hook") is not None:  # accelerate sets it as a plain attribute
            raise ValueError(f"{name}: models dispatched by accelerate (device_map, offload) are not supported on "
                             "the static decode path; use decode_path='eager'")
        for param in module._parameters.values():
            if param is None:
                continue
            if type(param).__name__ == "DTensor" or hasattr(param, "to_local"):
                raise ValueError(f"{name}: tensor-parallel (DTensor) models are not supported on the static decode "
                                 "path; use decode_path='eager'")
            devices.add(param.device)
    if len(devices) != 1:
        raise ValueError(f"{name}: the static decode path needs every parameter on one device, got "
                         f"{sorted(str(d) for d in devices)}; use decode_path='eager'")
    return devices.pop()


def check_static_path(target: torch.nn.Module, drafter: Any | None, settings: EngineSettings,
                      decode_path: str) -> tuple[int, TreeSetup | None]:
    """Refuse what the static path cannot do for ``target`` with ``drafter`` (None: the target
    alone) under ``settings`` and ``decode_path`` (``"static"``, ``"compiled"`` or ``"graphed"``),
    with a ``ValueError`` naming the argument; returns gamma (0 for the target alone; a tree's
    depth) and the generation's :class:`~specdecode.engine.static_tree.TreeSetup` (None for
    chains). ``"compiled"`` records CUDA graphs on a CUDA device, as ``"graphed"`` does, and
    needs what they need there."""
    where = f"decode_path={decode_path!r}"
    for name, value in (("logits_processor", settings.processors), ("stopping_criteria", settings.stopping),
                        ("streamer", settings.streamer)):
        if value is not None:
            raise ValueError(f"{name}: not supported with {where} (it needs the host at every token); "
                             "use decode_path='eager'")
    recurrent = kv_cache.has_recurrent_layers(target)
    if recurrent:
        from specdecode.models.recurrent_static import mixer_problem

        problem = mixer_problem(target)
        if problem is not None:
            raise ValueError(f"decode_path: {type(target).__name__} ({target.config.model_type}) has recurrent layers "
                             f"that {where} cannot step: {problem}; use decode_path='eager'")
    facts.check_decoder_forward(target, stepped=recurrent)
    device = _single_device(target, "target")
    graphed = decode_path == "graphed" or (decode_path == "compiled" and device.type == "cuda")
    tree = None
    if drafter is None:
        gamma = 0
    else:
        host = is_host_drafter(drafter) and not isinstance(drafter, StaticDrafter)
        if host and host_drafts_tree(drafter):  # tries proposed on the host, verified as static trees
            tree = check_static_tree(drafter, settings, decode_path, graphed=graphed, plan=host_tree_plan(drafter))
        if not host and not isinstance(drafter, StaticDrafter):
            raise ValueError(
                f"draft: {type(drafter).__name__} cannot draft on the static decode path (it needs static_key, "
                "static_prefill and static_propose: ModelDrafter, LayerSkipDrafter, EagleDrafter, MedusaDrafter and "
                "HydraDrafter have them; or static_host_drafts = True for a host drafter of deterministic chains, as "
                "NgramDrafter, SuffixDrafter, TokenizerBridgeDrafter and a FallbackDrafter of two of them); use "
                "decode_path='eager'"
            )
        if not host and drafts_tree(drafter):
            tree = check_static_tree(drafter, settings, decode_path, graphed=graphed)
        elif tree is None and type(settings.schedule) not in (ConstantSchedule, DraftSchedule):
            raise ValueError(f"draft_schedule: only the constant schedule runs with {where} (every step has one "
                             f"shape), got {getattr(settings.schedule, 'name', type(settings.schedule).__name__)!r}")
        gamma = settings.schedule.initial if tree is None else tree.plan.max_depth
        features = getattr(drafter, "feature_layers", None) is not None  # its network is no causal LM to probe
        for model in () if host else drafter_modules(drafter):  # (a host drafter's model runs eagerly on the host)
            if not isinstance(model, torch.nn.Module) or model is target:
                continue
            draft_device = _single_device(model, "draft")
            if draft_device != device:
                raise ValueError(f"draft: the static decode path needs the draft on the target's device ({device}), "
                                 f"got {draft_device}")
            if not features and not facts.accepts_custom_4d_mask(model):
                raise ValueError(_mask_message("draft", model))
    rule = settings.rule or "token"
    if tree is None and not is_chain_rule(rule):  # (check_static_tree checked a tree's rule)
        raise ValueError(f"rule: {rule!r} is not a chain rule; {where} verifies chains (or trees, drafted with tree=)")
    if tree is None and not get_rule(rule).builtin:
        raise ValueError(f"rule: {rule!r} is a Python rule; {where} needs a compiled rule (its coins come from "
                         "Philox on the device)")
    if not facts.accepts_custom_4d_mask(target):
        raise ValueError(_mask_message("target", target))
    if decode_path == "graphed" and device.type != "cuda":
        raise ValueError(f"decode_path: 'graphed' records CUDA graphs and needs a CUDA device, but the target is "
                         f"on {device}; decode_path='static' runs the same steps without graphs (or 'compiled', "
                         "compiled by torch.compile)")
    if graphed:
        ops = ("verify_logits_philox",) if tree is None else ("verify_tree_philox", "tree_attention_mask")
        if not settings.sampling.is_greedy:
            ops += ("sample_logits_philox",)
        missing = [op for op in ops if not _has_cuda_kernel(op)]
        if missing:
            raise ValueError(f"decode_path: {decode_path!r} needs the CUDA kernels of {', '.join(missing)}, which "
                             "this build of specdecode lacks (python -m specdecode info)")
    return gamma, tree


def _mask_message(name: str, model: torch.nn.Module) -> str:
    impl = getattr(getattr(model, "config", None), "_attn_implementation", None)
    return (f"{name}: {type(model).__name__} (attention implementation {impl!r}) does not honour a custom 4D attention "
            "mask with position ids, which static caches need; load it with attn_implementation='sdpa' or 'eager', "
            "or use decode_path='eager'")
