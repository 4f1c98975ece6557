"""Helpers of ``scripts/train_pair.py``: logging and stats files, the tokenizer, token streams,
model configs, the optimiser and schedule, the training loop, saving and loading models."""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from tqdm import tqdm

EOS = "<|endoftext|>"


def log(msg: str) -> None:
    tqdm.write(f"[train_pair {time.strftime('%H:%M:%S')}] {msg}")


def load_stats(out_dir: Path) -> dict:
    path = out_dir / "pair_stats.json"
    return json.loads(path.read_text()) if path.exists() else {}


def save_stats(out_dir: Path, stats: dict) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "pair_stats.json").write_text(json.dumps(stats, indent=2, sort_keys=True) + "\n")


def n_params(model: torch.nn.Module) -> int:
    """Unique parameter count (tied embedding counted once)."""
    return sum(p.numel() for p in model.parameters())


def train_tokenizer(train_texts: list[str], vocab_size: int, seq_len: int, out_dirs: list[Path]):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=[EOS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=True,
    )
    tok.train_from_iterator(train_texts, trainer=trainer, length=len(train_texts))
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=EOS,
        eos_token=EOS,
        pad_token=EOS,
        unk_token=None,
        clean_up_tokenization_spaces=False,
        model_max_length=2 * seq_len,
    )
    for d in out_dirs:
        save_tokenizer(fast, d)
    return fast


def save_tokenizer(tokenizer, path: Path) -> None:
    """``save_pretrained``, naming the portable class so transformers 4.x can load it too."""
    path.mkdir(parents=True, exist_ok=True)
    tokenizer.save_pretrained(path)
    cfg_path = path / "tokenizer_config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["tokenizer_class"] = "PreTrainedTokenizerFast"
    cfg_path.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")



def load_tokenizer(path: Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path)


def encode_stream(tokenizer, texts: list[str]) -> torch.Tensor:
    """Tokenize files and join them into one stream, each file followed by ``<|endoftext|>``."""
    eos = tokenizer.convert_tokens_to_ids(EOS)
    encs = tokenizer.backend_tokenizer.encode_batch(texts, add_special_tokens=False)
    ids: list[int] = []
    for enc in encs:
        ids.extend(enc.ids)
        ids.append(eos)
    return torch.tensor(ids, dtype=torch.long)


def sample_batch(stream: torch.Tensor, batch: int, seq: int, gen: torch.Generator) -> torch.Tensor:
    starts = torch.randint(0, stream.numel() - seq - 1, (batch,), generator=gen)
    return torch.stack([stream[s : s + seq + 1] for s in starts.tolist()])


def val_batches(stream: torch.Tensor, batch: int, seq: int, limit: int | None = None) -> list[torch.Tensor]:
    """Non-overlapping, fixed windows of the val stream (deterministic)."""
    n = (stream.numel() - 1) // seq
    windows = [stream[i * seq : i * seq + seq + 1] for i in range(n)]
    out = [torch.stack(windows[i : i + batch]) for i in range(0, len(windows), batch)]
    return out if limit is None else out[:limit]


@torch.no_grad()
def val_loss(model, batches: list[torch.Tensor]) -> float:
    model.eval()
    total, count = 0.0, 0
    for xb in batches:
        logits = model(input_ids=xb[:, :-1]).logits
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), xb[:, 1:].reshape(-1), reduction="sum")
        total += loss.item()
        count += xb[:, 1:].numel()
    model.train()
    return total / count


# --------------------------------------------------------------------------- models
def make_config(vocab: int, hidden: int, layers: int, heads: int, inter: int, seq: int, eos_id: int):
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=vocab,
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=heads,
        intermediate_size=inter,
        max_position_embeddings=2 * seq,
        tie_word_embeddings=True,
        bos_token_id=eos_id,
        eos_token_id=eos_id,
        pad_token_id=eos_id,
        rms_norm_eps=1e-5,
        initializer_range=0.02,
    )


def make_optimizer(model, lr: float, wd: float):
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        (decay if p.dim() >= 2 and "embed_tokens" not in name else no_decay).append(p)
    return torch.optim.AdamW(
        [{"params": decay, "weight_decay": wd}, {"params": no_decay, "weight_decay": 0.0}],
        lr=lr,
        betas=(0.9, 0.95),
        eps=1e-8,
    )


def lr_lambda(warmup: int, total: int, min_ratio: float):
    def f(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        progress = min(1.0, (step - warmup) / max(1, total - warmup))
        return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress))

    return f


def save_model(model, path: Path, tokenizer) -> None:
    """Save as fp16 safetensors, but declare float32 in config.json (plain load -> fp32)."""
    path.mkdir(parents=True, exist_ok=True)
    for old in path.glob("*.safetensors"):
        old.unlink()
    half = model.to(torch.float16)
    half.save_pretrained(path, safe_serialization=True)
    model.to(torch.float32)
    cfg_path = path / "config.json"
    cfg = json.loads(cfg_path.read_text())
    for key in ("dtype", "torch_dtype"):
        if key in cfg:
            cfg[key] = "float32"
    cfg["dtype"] = "float32"
    cfg_path.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
    save_tokenizer(tokenizer, path)


def load_model(path: Path):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    model.eval()
    return model


def train_loop(model, loss_fn, train_stream, val_b, args, steps: int, lr: float, desc: str) -> dict:
    gen = torch.Generator().manual_seed(args.seed + (1 if desc == "draft" else 0))
    opt = make_optimizer(model, lr, args.weight_decay)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_lambda(args.warmup, steps, args.min_lr_ratio))
    model.train()
    history = []
    t0 = time.time()
    bar = tqdm(range(steps), desc=f"train {desc}", dynamic_ncols=True)
    ema = None
    for step in bar:
        xb = sample_batch(train_stream, args.batch_size, args.seq_len, gen)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.bf16):
            loss = loss_fn(xb)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), args.grad_clip)
        opt.step()
        sched.step()
        ema = loss.item() if ema is None else 0.95 * ema + 0.05 * loss.item()
        bar.set_postfix(loss=f"{ema:.3f}", lr=f"{sched.get_last_lr()[0]:.2e}")
        if (step + 1) % args.eval_every == 0 or step + 1 == steps:
            vl = val_loss(model, val_b)
            history.append({"step": step + 1, "val_loss": round(vl, 4), "train_loss_ema": round(ema, 4)})
            log(f"{desc} step {step + 1}/{steps}: train(ema) {ema:.4f}  val {vl:.4f}  ({time.time() - t0:.0f}s)")
    return {"history": history, "train_seconds": round(time.time() - t0, 1)}


# --------------------------------------------------------------------------- stages
