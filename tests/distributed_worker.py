"""One rank of tests/test_distributed.py, launched by ``torchrun --nproc-per-node 2`` on the CPU
(gloo). Not a test module itself (pytest does not collect it: no ``test_`` prefix).

Every rank loads the target saved in ``model_dir`` with Hugging Face tensor parallelism
(``tp_plan="auto"``: its layers' weights become DTensors sharded over the two ranks), the draft
from ``draft_dir`` unsharded, runs the same speculative generations with the same seeds, and
saves what it got to ``out_dir/rank{r}.pt``. The test compares the ranks with each other and
with a single-process run.

Usage: python -m torch.distributed.run --standalone --nproc-per-node 2 distributed_worker.py \
    MODEL_DIR DRAFT_DIR OUT_DIR
"""

from __future__ import annotations

import datetime
import os
import sys
import warnings

import torch
import torch.distributed as dist

DISTRIBUTED_CASES = dict(max_new_tokens=12, num_draft_tokens=3)
SAMPLING = dict(do_sample=True, temperature=0.9, top_k=20)
SAMPLING_SEED = 11


def prompts() -> tuple[torch.Tensor, torch.Tensor]:
    """A left-padded batch of 3 prompts (ids >= 3: no pad / eos / bos inside)."""
    g = torch.Generator().manual_seed(5)
    lengths = [4, 7, 2]
    ids = torch.zeros((3, 7), dtype=torch.long)
    mask = torch.zeros((3, 7), dtype=torch.long)
    for i, n in enumerate(lengths):
        ids[i, 7 - n:] = torch.randint(3, 128, (n,), generator=g)
        mask[i, 7 - n:] = 1
    return ids, mask


def load_tensor_parallel(model_dir: str):
    from transformers import AutoModelForCausalLM

    try:
        from transformers.distributed import DistributedConfig
    except ImportError:  # older transformers: the standalone keyword
        return AutoModelForCausalLM.from_pretrained(model_dir, tp_plan="auto", dtype=torch.float32).eval()
    return AutoModelForCausalLM.from_pretrained(
        model_dir, distributed_config=DistributedConfig(tp_plan="auto"), dtype=torch.float32
    ).eval()


def vocab_sharded_logits(module, inputs, output):
    """A forward hook on the LM head: hands back its (replicated) output as a DTensor sharded
    over the vocabulary, as a tensor-parallel plan without an output gather would."""
    from torch.distributed.tensor import DTensor, Shard

    mesh = module.weight.device_mesh
    rank, world = dist.get_rank(), dist.get_world_size()
    width = output.shape[-1] // world
    return DTensor.from_local(output[..., rank * width: (rank + 1) * width].contiguous(), mesh, [Shard(-1)])


def main(model_dir: str, draft_dir: str, out_dir: str) -> None:
    warnings.filterwarnings("ignore")
    torch.set_num_threads(1)
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    rank = dist.get_rank()
    from torch.distributed.tensor import DTensor
    from transformers import AutoModelForCausalLM

    import specdecode
    from specdecode.models import facts

    target = load_tensor_parallel(model_dir)
    draft = AutoModelForCausalLM.from_pretrained(draft_dir, dtype=torch.float32).eval()
    q_proj = target.model.layers[0].self_attn.q_proj.weight
    ids, mask = prompts()
    result: dict = {
        "world_size": dist.get_world_size(),
        "q_proj_is_dtensor": isinstance(q_proj, DTensor),
        "q_proj_local_rows": int(facts.local_tensor(q_proj).shape[0]),
        "q_proj_rows": int(q_proj.shape[0]),
        "vocab_rows": facts.vocab_rows(target),
        "input_device": str(facts.input_device(target)),
    }
    result["hf_greedy"] = target.generate(ids, attention_mask=mask, max_new_tokens=DISTRIBUTED_CASES["max_new_tokens"],
                                          do_sample=False, pad_token_id=0)
    out = specdecode.generate(target, draft, ids, mask, **DISTRIBUTED_CASES)
    result["greedy"] = out.sequences
    result["greedy_accepted"] = out.stats.accepted_tokens
    out = specdecode.generate(target, specdecode.LayerSkipDrafter(target, num_layers=1), ids, mask,
                              **DISTRIBUTED_CASES)
    result["layer_skip_greedy"] = out.sequences
    out = specdecode.generate(target, draft, ids, mask, **DISTRIBUTED_CASES, **SAMPLING,
                              generator=torch.Generator().manual_seed(SAMPLING_SEED))
    result["sampled"] = out.sequences
    result["sampled_rejections"] = out.stats.rejections

    handle = target.lm_head.register_forward_hook(vocab_sharded_logits)
    with torch.no_grad():
        raw = target(ids[:1, -2:]).logits
    result["hooked_logits_are_dtensor"] = isinstance(raw, DTensor)
    out = specdecode.generate(target, draft, ids, mask, **DISTRIBUTED_CASES)
    result["greedy_dtensor_logits"] = out.sequences
    handle.remove()

    torch.save(result, os.path.join(out_dir, f"rank{rank}.pt"))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(*sys.argv[1:4])
