r"""What rolling back a recurrent state costs: a hybrid model (Mamba2 or gated-delta layers with
attention) against a plain-attention Llama of the same width and depth, each verifying the same
kind of drafts with the same acceptance.

    python benchmarks/bench_recurrent.py                     # bamba and qwen3_next vs llama
    python benchmarks/bench_recurrent.py --hybrids falcon_h1 --repeats 7

The drafts come from an oracle: the target's own greedy continuation (made once by the model's
``generate``), ``--draft`` tokens a step, with the token at position ``--accept`` replaced by a
wrong one, so every step accepts exactly ``--accept`` drafts (``--accept`` equal to ``--draft``:
every draft accepted) whatever the weights. Per model, interleaved run by run, the medians of:

- ``target``: the target alone, Hugging Face's ``generate``, tokens a second;
- ``all kept``: every draft accepted: verification forwards only, no rollback;
- ``rollback``: ``--accept`` of ``--draft`` kept: a plain-attention model crops its cache, a hybrid
  copies its states before each verification, puts them back and feeds the kept tokens again
  (one more forward a step; specdecode.engine.replay).
- ``static alone`` / ``static rollback``: the static path (``decode_path="static"``, or with
  ``--compiled`` ``"compiled"``), the target
  alone and the rollback run's drafts; a hybrid's mixers step through each verification forward one
  position at a time and each row keeps the states after its kept drafts
  (specdecode.models.recurrent_static: no replay); ``x_static`` is their ratio, the speculative
  gain on that path.

``rollback/kept`` is the rollback run's time over the all-kept run's: fewer tokens a step for every
model, and for a hybrid also the replays (counted among its target calls) and the state copies; a
hybrid's ratio over Llama's is what the rollback design costs. ``x_target`` is the rollback run's
speed over Hugging Face's ``generate``. Random
weights (the acceptance is forced), float32, CPU, ``--threads`` threads; the hybrids run
transformers' PyTorch reference kernels here (no ``mamba-ssm`` / ``flash-linear-attention``), so
their absolute speed says little, the ratios within each model are the point. Greedy identity
with the model's own output is checked on every run.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from test_generate_recurrent import hybrid_config  # noqa: E402  (the tested tiny configs, resized)

import specdecode  # noqa: E402
from specdecode.drafters import DrafterBase, DraftState, Proposal  # noqa: E402


class OracleDrafter(DrafterBase):
    """Proposes the next ``k`` tokens of a known continuation, the one at ``accept`` made wrong."""

    name = "oracle"
    static_host_drafts = True  # deterministic chains: it feeds the static path as prompt lookup does

    def __init__(self, continuation: torch.Tensor, prompt_len: int, accept: int, vocab: int) -> None:
        self.continuation, self.prompt_len, self.accept, self.vocab = continuation, prompt_len, accept, vocab

    def propose(self, state: DraftState, num_tokens: int) -> Proposal:
        rows = []
        for context in state.contexts():
            start = context.numel()
            tokens = self.continuation[start: start + num_tokens].clone()
            tokens = torch.cat([tokens, tokens.new_zeros(num_tokens - tokens.numel())]) + 0
            if self.accept < num_tokens:
                tokens[self.accept] = (tokens[self.accept] + 1) % self.vocab
            rows.append(tokens)
        return Proposal(torch.stack(rows).to(state.device))


class HFRun:
    """Hugging Face's ``generate`` output, shaped like ours for the loop below."""

    def __init__(self, sequences: torch.Tensor) -> None:
        self.sequences, self.stats = sequences, None


def build(kind: str, hidden: int, layers: int, vocab: int) -> torch.nn.Module:
    import transformers as tf

    torch.manual_seed(0)
    if kind == "llama":
        config = tf.LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden,
                                num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                                max_position_embeddings=1024)
    else:
        config = hybrid_config(kind, vocab)
        mamba_heads = 2 * hidden // 32  # Mamba2 mixers: expand 2, heads of 32
        for key, value in (("hidden_size", hidden), ("intermediate_size", 2 * hidden), ("mamba_n_heads", mamba_heads),
                           ("mamba_d_head", 32), ("n_mamba_heads", mamba_heads), ("mamba_headdim", 32)):
            if hasattr(config, key):
                setattr(config, key, value)
        config.max_position_embeddings = 1024
    model = tf.AutoModelForCausalLM.from_config(config).eval()
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() > 1:
                p.normal_(0, 0.1)
    model.config.eos_token_id = model.generation_config.eos_token_id = None
    return model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--hybrids", nargs="+", default=["bamba", "qwen3_next"])
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--vocab", type=int, default=512)
    parser.add_argument("--prompt-len", type=int, default=32)
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--draft", type=int, default=4)
    parser.add_argument("--accept", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--compiled", action="store_true",
                        help="the static runs on decode_path='compiled' (Inductor: minutes of compiling first)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    ids = torch.randint(3, args.vocab, (1, args.prompt_len), generator=torch.Generator().manual_seed(0))
    n = args.max_new_tokens
    static = "compiled" if args.compiled else "static"
    rows = []
    for kind in ["llama", *args.hybrids]:
        model = build(kind, args.hidden, 3, args.vocab)
        want = model.generate(ids, do_sample=False, max_new_tokens=n, pad_token_id=0)
        common = dict(max_new_tokens=n, eos_token_id=[], pad_token_id=0, tree=None)
        runs = {"target": lambda: HFRun(model.generate(ids, do_sample=False, max_new_tokens=n, pad_token_id=0)),
                "all kept": lambda: specdecode.generate(
                    model, OracleDrafter(want[0], args.prompt_len, args.draft, args.vocab), ids,
                    num_draft_tokens=args.draft, **common),
                "rollback": lambda: specdecode.generate(
                    model, OracleDrafter(want[0], args.prompt_len, args.accept, args.vocab), ids,
                    num_draft_tokens=args.draft, **common),
                "static alone": lambda: specdecode.generate(model, None, ids, decode_path=static, **common),
                "static rollback": lambda: specdecode.generate(
                    model, OracleDrafter(want[0], args.prompt_len, args.accept, args.vocab), ids,
                    num_draft_tokens=args.draft, decode_path=static, **common)}
        times: dict[str, list[float]] = {name: [] for name in runs}
        calls: dict[str, int] = {}
        for _ in range(args.repeats + 1):  # the first round warms up, then interleaved
            for name, run in runs.items():
                start = time.perf_counter()
                out = run()
                times[name].append(time.perf_counter() - start)
                calls[name] = out.stats.target_calls if out.stats is not None else n
                if not torch.equal(out.sequences, want):
                    raise SystemExit(f"{kind} {name}: not the model's own greedy output")
        med = {name: statistics.median(t[1:]) for name, t in times.items()}
        rows.append((kind, n / med["target"], n / med["all kept"], n / med["rollback"], calls["all kept"],
                     calls["rollback"], med["rollback"] / med["all kept"], med["target"] / med["rollback"],
                     n / med["static alone"], n / med["static rollback"], med["static alone"] / med["static rollback"]))
    print(f"hidden {args.hidden}, 3 layers, vocabulary {args.vocab}, prompt {args.prompt_len}, {n} new tokens, "
          f"{args.accept} of {args.draft} drafts kept a step, {args.repeats} interleaved runs, medians; "
          f"static columns: decode_path={static!r}")
    print(f"{'model':<12}{'target tok/s':>13}{'all kept':>10}{'rollback':>10}{'calls kept':>12}"
          f"{'calls rollback':>16}{'rollback/kept':>15}{'x_target':>10}{'static alone':>14}{'static rollback':>17}"
          f"{'x_static':>10}")
    for kind, target, kept, rolled, calls_kept, calls_rolled, ratio, x, alone, static, x_static in rows:
        print(f"{kind:<12}{target:>13.1f}{kept:>10.1f}{rolled:>10.1f}{calls_kept:>12}{calls_rolled:>16}"
              f"{ratio:>15.2f}{x:>10.2f}{alone:>14.1f}{static:>17.1f}{x_static:>10.2f}")
    print("rollback/kept: time of the rollback run over the all-kept run (more steps for every model; for a "
          "hybrid also its replays and state copies): a hybrid's ratio over llama's is what the rollback design costs")


if __name__ == "__main__":
    main()
