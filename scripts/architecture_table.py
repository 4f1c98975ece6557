"""Every decoder-only causal LM type of the installed transformers, built tiny from its config,
run through specdecode: the table in docs/model-families.md.

For each model type of ``MODEL_FOR_CAUSAL_LM_MAPPING_NAMES``: its config class with small sizes
(hidden 64, 2-4 layers, 4 heads, vocabulary 128, sliding windows and chunks of 6 tokens where it
has them), random weights (seed 0, normal 0.15), a prompt of 14 tokens and 20 new ones (so past
every window), greedy. The reference is the model's own ``generate``; specdecode runs with a
one-layer Llama draft of the same vocabulary (chains), on the eager and static paths. Each cell
says ``same`` (the reference's tokens), ``forward's`` (not ``generate``'s tokens but those of the
model's own forward without a cache, token by token: a model whose cached ``generate`` departs
from its forward, as Moshi's does with its window), ``differs``, ``refused`` (a ValueError naming why, as
the library means to), ``error`` (any other exception from inside specdecode: a bug to fix) or,
for the row, why the tiny model could not be built or run by transformers itself.

Usage:
    python scripts/architecture_table.py [--types llama mistral ...] [--out build/architectures.md]
        [--timeout 120]

Runs a few minutes for every type (2 cores); one type at a time, each under a time limit.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import signal
import sys
import time
import traceback
import warnings

import torch

SIZES = dict(hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
             vocab_size=128, max_position_embeddings=512, sliding_window=6, attention_chunk_size=6,
             n_embd=64, n_head=4, n_layer=2, n_positions=512, d_model=64, ffn_dim=128, n_positions_embd=512,
             moe_intermediate_size=32, shared_expert_intermediate_size=32, num_experts=4, num_local_experts=4,
             num_experts_per_tok=2, kv_lora_rank=16, q_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=8,
             v_head_dim=16, linear_num_value_heads=4, linear_num_key_heads=2, linear_key_head_dim=16,
             linear_value_head_dim=16, mamba_n_heads=4, mamba_d_head=32, mamba_n_groups=1, mamba_d_state=16,
             mamba_chunk_size=8, mamba_d_ssm=64, n_mamba_heads=4, mamba_headdim=32, mamba_ngroups=1, chunk_size=8,
             mamba_num_heads=4, mamba_head_dim=16, ssm_state_size=16, n_groups=1, state_size=16, time_step_rank=8,
             mamba_dt_rank=8)
# Types whose configs check sizes against each other: what their tiny models need besides SIZES.
OVERRIDES = {
    "falcon_h1": dict(mamba_n_heads=4, mamba_d_head=16, mamba_d_ssm=64, num_hidden_layers=3),
    "zamba2": dict(mamba_headdim=32, n_mamba_heads=4, layers_block_type=["mamba", "hybrid", "mamba"],
                   num_hidden_layers=3),
    "jamba": dict(attn_layer_period=2, attn_layer_offset=1, expert_layer_period=4, num_experts=2,
                  mamba_d_state=8, mamba_dt_rank=8, num_hidden_layers=3),
    "lfm2": dict(layer_types=["conv", "full_attention", "conv"], num_hidden_layers=3),
    "lfm2_moe": dict(layer_types=["conv", "full_attention", "conv"], num_hidden_layers=3),
    "qwen3_next": dict(layer_types=["linear_attention", "full_attention", "linear_attention"],
                       num_hidden_layers=3),
    "granitemoehybrid": dict(layer_types=["mamba", "attention", "mamba"], num_hidden_layers=3),
    "bamba": dict(attn_layer_indices=[1], num_hidden_layers=3),
    "nemotron_h": dict(layers_block_type=["mamba", "attention", "mlp"], num_hidden_layers=3),
}
PAD, EOS, BOS = 0, 1, 2
PROMPT, NEW = 14, 20


class Timeout(Exception):
    pass


def _alarm(_signum, _frame):
    raise Timeout()


def _set(config, key, value) -> None:
    """Set ``key`` where the config lets it be set (some are properties derived from others)."""
    try:
        setattr(config, key, value)
    except (AttributeError, TypeError, ValueError):
        pass


def tiny_config(model_type: str):
    from transformers import CONFIG_MAPPING

    config_class = CONFIG_MAPPING[model_type]
    config = config_class()
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    for key, value in SIZES.items():
        if hasattr(text, key) and getattr(text, key) is not None:
            _set(text, key, value)
    layers = getattr(text, "num_hidden_layers", None)
    if isinstance(layers, int):
        for key in ("layer_types", "layers_block_type"):
            types = getattr(text, key, None)
            if isinstance(types, (list, tuple)) and types:
                kinds = list(dict.fromkeys(types))  # keep every kind: at least one layer of each
                count = max(2, min(len(kinds) + 1, 4))
                chosen = (kinds * count)[:count]
                _set(text, key, chosen)
                layers = count
        _set(text, "num_hidden_layers", min(layers, 4) if layers else 2)
    for key, value in (("pad_token_id", PAD), ("eos_token_id", None), ("bos_token_id", BOS)):
        if hasattr(text, key):
            _set(text, key, value)
    if text is not config:
        return config
    values = {**text.to_dict(), **OVERRIDES.get(model_type, {})}
    for derived in ("layer_types", "layers_block_type"):  # derived from the overrides where they are set
        if derived not in OVERRIDES.get(model_type, {}) and model_type in OVERRIDES:
            values.pop(derived, None)
    return config_class(**values)


def build(model_type: str):
    from transformers import AutoModelForCausalLM

    config = tiny_config(model_type)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config).eval()
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() > 1:
                p.normal_(0, 0.15)
    model.config.eos_token_id = None
    if getattr(model, "generation_config", None) is not None:
        model.generation_config.eos_token_id = None
    return model


def draft_for(vocab: int):
    import transformers as tf

    torch.manual_seed(1)
    config = tf.LlamaConfig(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                            num_attention_heads=2, num_key_value_heads=1, pad_token_id=PAD, eos_token_id=EOS,
                            bos_token_id=BOS)
    return tf.AutoModelForCausalLM.from_config(config).eval()


def cell(run) -> str:
    try:
        result = run()
    except ValueError as e:
        return f"refused: {str(e).split(':', 1)[-1].strip()[:110]}"
    except Timeout:
        raise
    except Exception as e:  # noqa: BLE001 - recorded: an internal error is a bug to fix
        frame = traceback.extract_tb(e.__traceback__)[-1]
        return f"error: {type(e).__name__} at {frame.filename.rsplit('/', 1)[-1]}:{frame.lineno}"
    return result


def row(model_type: str) -> tuple[str, str, str]:
    import specdecode

    try:
        model = build(model_type)
        vocab = int(model.get_input_embeddings().weight.shape[0])
        ids = torch.randint(3, min(vocab, 128), (1, PROMPT), generator=torch.Generator().manual_seed(2))
        want = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=NEW,
                              pad_token_id=PAD)
        forward_greedy = ids
        with torch.no_grad():  # the model's forward without a cache, token by token
            for _ in range(NEW):
                logits = model(input_ids=forward_greedy, use_cache=False).logits[:, -1]
                forward_greedy = torch.cat([forward_greedy, logits.argmax(-1, keepdim=True)], 1)
    except Timeout:
        raise
    except Exception as e:  # noqa: BLE001
        return (f"not run: transformers could not build or generate with the tiny model ({type(e).__name__})",
                "", "")
    draft = draft_for(vocab)

    def ours(path: str):
        def run() -> bool:
            out = specdecode.generate(model, draft, ids, max_new_tokens=NEW, num_draft_tokens=4, tree=None,
                                      eos_token_id=[], pad_token_id=PAD, decode_path=path)
            if torch.equal(out.sequences, want):
                return "same"
            return "forward's" if torch.equal(out.sequences, forward_greedy) else "differs"
        return run

    return "", cell(ours("eager")), cell(ours("static"))


def main() -> int:
    from transformers import __version__
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--types", nargs="*", help="model types (default: every causal LM type)")
    parser.add_argument("--out", default="build/architectures.md", help="the Markdown table")
    parser.add_argument("--timeout", type=int, default=120, help="seconds per model type")
    args = parser.parse_args()
    types = args.types or sorted(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)
    torch.set_num_threads(2)
    signal.signal(signal.SIGALRM, _alarm)
    lines = [f"Run on transformers {__version__}, torch {torch.__version__} "
             f"(`python scripts/architecture_table.py`, {time.strftime('%Y-%m-%d')}).", "",
             "| model type | eager | static |", "|---|---|---|"]
    counts: dict[str, int] = {}
    for model_type in types:
        start = time.perf_counter()
        signal.alarm(args.timeout)
        try:
            with warnings.catch_warnings(), contextlib.redirect_stderr(io.StringIO()):
                warnings.simplefilter("ignore")
                note, eager, static = row(model_type)
        except Timeout:
            note, eager, static = f"not run: over {args.timeout} s", "", ""
        finally:
            signal.alarm(0)
        if note:
            line = f"| {model_type} | {note} | |"
            counts["not run"] = counts.get("not run", 0) + 1
        else:
            line = f"| {model_type} | {eager} | {static} |"
            for result in (eager, static):
                key = result.split(":")[0]
                counts[key] = counts.get(key, 0) + 1
        lines.append(line)
        print(f"{line}  ({time.perf_counter() - start:.1f} s)", flush=True)
    lines += ["", "Totals (cells): " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items()))]
    with open(args.out, "w") as f:
        f.write("\n".join(lines) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
