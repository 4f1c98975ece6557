"""The methods of the decode-path benchmark (``python -m specdecode bench --device ...``): one
:class:`Runner` per (method, pair, batch size, temperature), or the reason it does not run.

The methods are listed, with what each row means, in :mod:`specdecode.bench.gpu`'s docstring.
"""

from __future__ import annotations

import argparse
from typing import Any

import torch

from specdecode.bench.gpu_pairs import chain_drafter, tree_drafter

METHODS = ("target HF", "target graphed", "HF assisted", "eager chain", "graphed chain", "eager tree",
           "graphed static tree", "graphed dynamic tree", "eager lookup", "graphed lookup", "target compiled",
           "compiled chain", "HF static compiled")
#: The methods that run on a static path (kernels per step counted), with the path's name.
STATIC_METHODS = {"target graphed": "graphed", "graphed chain": "graphed", "graphed static tree": "graphed",
                  "graphed dynamic tree": "graphed", "graphed lookup": "graphed", "target compiled": "compiled",
                  "compiled chain": "compiled"}
#: The methods that compile (``torch.compile``) once per layout: ``--quick`` leaves them out
#: unless ``--methods`` names them, ``--compiled-batch-sizes`` limits their batch sizes.
COMPILED_METHODS = ("target compiled", "compiled chain", "HF static compiled")
#: The methods with a time split (one more generation with ``phase_timing=True``).
SPLIT_METHODS = ("target graphed", "graphed chain", "graphed static tree", "graphed dynamic tree")
#: The tree each tree method drafts.
TREES = {"eager tree": "dynamic", "graphed static tree": "static", "graphed dynamic tree": "dynamic"}


def has_kernel(op: str, device: torch.device) -> bool:
    """Whether specdecode's operator ``op`` has a kernel for ``device`` (always on the CPU)."""
    if device.type == "cpu":
        return True
    key = {"cuda": "CUDA"}.get(device.type, device.type.upper())
    return bool(torch._C._dispatch_has_kernel_for_dispatch_key(f"specdecode::{op}", key))


def skip_reason(method: str, draft: Any, device: torch.device, temperature: float) -> str | None:
    """Why ``method`` cannot run with this pair's ``draft`` on ``device`` (None: it can)."""
    if method == "HF assisted" and not isinstance(draft, torch.nn.Module):
        return (f"Hugging Face's assistant_model takes a causal LM; this pair's drafter ({type(draft).__name__}) "
                "is not one")
    if method in TREES and not has_kernel("verify_tree", device):
        return f"verify_tree has no {device.type} kernel in this build"
    if method in STATIC_METHODS and device.type == "cuda":
        if not has_kernel("verify_logits_philox", device):
            return "verify_logits_philox has no CUDA kernel in this build"
        if temperature > 0 and not has_kernel("sample_logits_philox", device):
            return "sample_logits_philox has no CUDA kernel in this build"
    return None


def hf_compile_config(device: torch.device) -> Any:
    """Hugging Face's ``CompileConfig`` for the static-cache target: its defaults (Inductor,
    ``reduce-overhead``: CUDA graphs on a GPU); on another device with transformers' own flag
    that compiles there too (``generate`` compiles on CUDA only otherwise)."""
    from transformers import CompileConfig

    config = CompileConfig()
    if device.type != "cuda":
        config._compile_all_devices = True
    return config


class Runner:
    """``runner(phase_timing) -> (new tokens, stats list)``: one method over every batch, from
    the same seed each time. After a call, ``outputs`` holds each row's new tokens and
    ``generations`` the number of generate calls; ``drafter`` is the drafter object the static
    methods run (their kernels per step are counted with it).

    Shape: ``batches``: a list of ``(ids, mask)``, each ``[B, L]`` int64, left-padded."""

    def __init__(self, method: str, target: Any, draft: Any, batches: list[tuple[torch.Tensor, torch.Tensor]],
                 args: argparse.Namespace, temperature: float, device: torch.device, pad_id: int,
                 max_new_tokens: int | None = None) -> None:
        self.method, self.target, self.draft, self.batches = method, target, draft, batches
        self.args, self.device, self.pad_id = args, device, pad_id
        self.max_new_tokens = max_new_tokens or args.max_new_tokens
        self.sampling = dict(do_sample=True, temperature=temperature) if temperature > 0 else dict(do_sample=False)
        self.outputs: list[list[int]] = []
        self.generations = len(batches)
        self.drafter: Any = None
        if method.startswith("target") and method in STATIC_METHODS:
            from specdecode.engine.static_loop import TargetOnly

            self.drafter = TargetOnly()
        elif method in TREES:
            self.drafter = tree_drafter(draft, TREES[method], args.tree_nodes)
        elif method in ("eager chain", "graphed chain", "compiled chain"):
            self.drafter = chain_drafter(draft)
        elif method in ("eager lookup", "graphed lookup"):  # prompt lookup, proposed on the host
            from specdecode.drafters import NgramDrafter

            self.drafter = NgramDrafter()
        self.hf_static: dict[str, Any] = {}
        if method == "HF static compiled":
            from transformers import GenerationConfig

            self.hf_static = dict(cache_implementation="static", compile_config=hf_compile_config(device))
            if hasattr(GenerationConfig(), "max_cache_len"):  # one cache size for every prompt: one compile
                self.hf_static["max_cache_len"] = max(ids.shape[1] for ids, _ in batches) + self.max_new_tokens

    def __call__(self, phase_timing: bool = False) -> tuple[int, list[Any]]:
        import specdecode

        method, args = self.method, self.args
        common = dict(max_new_tokens=self.max_new_tokens, pad_token_id=self.pad_id)
        new, stats, self.outputs = 0, [], []
        gen = torch.Generator(device=self.device if self.device.type == "cuda" else "cpu").manual_seed(args.seed)
        torch.manual_seed(args.seed)
        for ids, mask in self.batches:
            if method in ("target HF", "HF assisted", "HF static compiled"):
                extra: dict[str, Any] = {}
                if method == "HF assisted":
                    extra["assistant_model"] = self.draft
                elif method == "HF static compiled":
                    extra.update(self.hf_static)
                sequences = self.target.generate(ids, attention_mask=mask, **common, **extra, **self.sampling)
            else:
                kwargs: dict[str, Any] = dict(eos_token_id=[], generator=gen, **common, **self.sampling)
                if method in STATIC_METHODS:
                    path = STATIC_METHODS[method]
                    kwargs["decode_path"] = ("graphed" if self.device.type == "cuda" else "static") \
                        if path == "graphed" else path
                    kwargs["phase_timing"] = phase_timing
                model = None if method.startswith("target") else self.drafter
                if method not in TREES and model is not None:
                    kwargs.update(num_draft_tokens=args.gamma, rule="token")
                out = specdecode.generate(self.target, model, ids, mask, **kwargs)
                sequences = out.sequences
                stats.append(out.stats)
            width = ids.shape[1]
            new += (sequences.shape[1] - width) * ids.shape[0]
            self.outputs += sequences[:, width:].tolist()
        return new, stats


def make_runner(method: str, target: Any, draft: Any, batches: list[tuple[torch.Tensor, torch.Tensor]],
                args: argparse.Namespace, temperature: float, device: torch.device, pad_id: int,
                max_new_tokens: int | None = None) -> Runner | str | None:
    """The :class:`Runner` of ``method``; a string saying why it cannot run with this pair or
    build (a row says so); None where it does not apply at this batch size (HF assisted beyond
    batch 1, compiled methods outside ``--compiled-batch-sizes``).

    Shape: ``batches``: a list of ``(ids, mask)``, each ``[B, L]`` int64, left-padded."""
    batch = batches[0][0].shape[0]
    if method == "HF assisted" and batch != 1:
        return None
    sizes = getattr(args, "compiled_batch_sizes", None)
    if method in COMPILED_METHODS and sizes and batch not in sizes:
        return None
    reason = skip_reason(method, draft, device, temperature)
    if reason is not None:
        return reason
    return Runner(method, target, draft, batches, args, temperature, device, pad_id, max_new_tokens)


def greedy_match(outputs: list[list[int]], reference: list[list[int]]) -> float:
    """The share of rows whose new tokens equal the reference's (the target's own greedy
    output), NaN without a reference of the same rows."""
    if not reference or len(reference) != len(outputs):
        return float("nan")
    return sum(a == b for a, b in zip(outputs, reference)) / len(outputs)
