r"""Gemma 3 270M with drafters that need no training (``specdecode.load_pair("gemma3", drafter=...)``):
prompt lookup, SuffixDecoding, layer skipping and SmolLM2-135M-Instruct across tokenizers, beside the
target alone on specdecode's CPU fast path, Hugging Face's ``generate`` and its universal assisted
decoding with the same SmolLM2 draft. Batch 1, T = 0, EOS off.

    # tune: choose the drafters' settings on the tune prompts
    flock /tmp/bench.lock python benchmarks/bench_gemma3_pair.py --prompt-set tune --num-prompts 6 \
        --variants ngram:k=3 ngram:k=5 suffix:k=8 suffix:k=16 smollm2:k=3 layer_skip:k=2:num_layers=9
    # report: the held-out prompts, never looked at while tuning, every drafter with its tuned settings
    flock /tmp/bench.lock python benchmarks/bench_gemma3_pair.py --prompt-set report

Prompts: :data:`specdecode.prompt_sets.PROMPT_SETS` (Gemma 3 270M is a base model: code and prose to
continue), ``tune`` (8 code + 8 prose) to choose settings, ``report`` (another 8 + 8) to report,
taken code and prose in turn (``--num-prompts 4``: two of each). A
variant is ``KIND[:k=K][:NAME=VALUE...]``: a drafter of :data:`specdecode.pairs.GEMMA3_DRAFTERS`
with its tuned settings (:data:`specdecode.pairs.GEMMA3_SETTINGS`), ``k`` its draft length and the
others its constructor's arguments overridden. Without ``--variants``, each drafter as tuned.

Each prompt is run by every method in turn (interleaved, so that a slow minute of a shared machine
hits every method alike), ``--repeats`` rounds; a method's time on a prompt is its median over the
rounds, its tok/s the new tokens over the sum of those medians. One untimed run on a prompt outside
both sets warms every method up first. At T = 0 every specdecode row is checked against the target
alone's greedy output (differences are counted in ``mismatch``: the fast path sums in another
order than torch's, so a near-tie can flip). Columns: ``tok/call`` (new tokens per target call),
``tok/s``, ``x target`` (over the target alone on the fast path), ``x HF``, ``x HF UAD``.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

import torch

ALONE = "target alone (fast path)"
HF = "HF generate"
HF_UAD = "HF assisted, SmolLM2 (UAD)"


def parse_variant(text: str) -> tuple[str, dict[str, Any]]:
    """``"ngram:k=5:max_ngram=4"`` -> ``("ngram", {"num_draft_tokens": 5, "max_ngram": 4})``;
    ``ValueError`` naming ``--variants`` for a kind or a field it does not know."""
    from specdecode.pairs import GEMMA3_DRAFTERS

    kind, *fields = text.split(":")
    if kind not in GEMMA3_DRAFTERS:
        raise ValueError(f"--variants: {text!r}: the kind must be one of {', '.join(GEMMA3_DRAFTERS)}")
    options: dict[str, Any] = {}
    for field in fields:
        name, sep, value = field.partition("=")
        if not sep or not name or not value:
            raise ValueError(f"--variants: {text!r}: expected NAME=VALUE fields after the kind, got {field!r}")
        options["num_draft_tokens" if name == "k" else name] = _value(value)
    return kind, options


def _value(text: str) -> Any:
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            pass
    return {"true": True, "false": False, "none": None}.get(text.lower(), text)


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    from specdecode.bench.harness import base_parser, format_table, without_eos, write_results
    from specdecode.cli_args import int_at_least

    parser = base_parser("Gemma 3 270M with drafters needing no training (batch 1, T = 0, CPU)")
    parser.add_argument("--prompt-set", choices=["tune", "report"], default="report")
    parser.add_argument("--num-prompts", type=int_at_least("num_prompts", 1), default=16)
    parser.add_argument("--max-new-tokens", type=int_at_least("max_new_tokens", 1), default=48)
    parser.add_argument("--threads", type=int_at_least("threads", 1), default=2)
    parser.add_argument("--variants", nargs="+", default=None, help="drafter settings to compare (see above)")
    parser.add_argument("--no-hf", action="store_true", help="leave out the two Hugging Face rows")
    args = parser.parse_args(argv)
    try:
        variants = [parse_variant(v) for v in args.variants] if args.variants else None
    except ValueError as exc:
        parser.error(str(exc))
    torch.set_num_threads(args.threads)

    import specdecode
    from specdecode.pairs import GEMMA3_DRAFTERS, GEMMA3_SETTINGS, gemma3_drafter
    from specdecode.prompt_sets import prompt_set
    from specdecode.training.targets import load_target

    if variants is None:
        variants = [(kind, {}) for kind in GEMMA3_DRAFTERS]
    target, tok = load_target("gemma3")  # ~50 s: once per run
    without_eos(target)
    needs_smollm2 = not args.no_hf or any(kind == "smollm2" for kind, _ in variants)
    draft = load_target("smollm2") if needs_smollm2 else None
    if draft is not None:
        without_eos(draft[0])
    code, prose = prompt_set(f"{args.prompt_set}-code"), prompt_set(f"{args.prompt_set}-prose")
    texts = [t for pair in zip(code, prose) for t in pair][: args.num_prompts]  # code and prose in turn
    prompts = [tok(t, return_tensors="pt").input_ids for t in texts]
    warm = tok("def main():\n    total = 0\n    for i in range(10):\n", return_tensors="pt").input_ids
    n = args.max_new_tokens

    methods: dict[str, Any] = {ALONE: None}
    if not args.no_hf:
        methods[HF] = None
        methods[HF_UAD] = None
    for kind, options in variants:
        name = kind + "".join(f" {k.replace('num_draft_tokens', 'k')}={v}" for k, v in options.items())
        methods[name] = (kind, options)

    def run(name: str, ids: torch.Tensor) -> tuple[float, torch.Tensor, Any]:
        spec = methods[name]
        mask = torch.ones_like(ids)
        start = time.perf_counter()
        stats = None
        if name == ALONE:
            with specdecode.cpu.accelerated(target):
                out = target.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=n, pad_token_id=0)
        elif name == HF:
            out = target.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=n, pad_token_id=0)
        elif name == HF_UAD:
            out = target.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=n, pad_token_id=0,
                                  assistant_model=draft[0], tokenizer=tok, assistant_tokenizer=draft[1])
        else:
            kind, options = spec
            # a fresh drafter per generation (SuffixDecoding would otherwise remember earlier prompts);
            # building one copies nothing but, for smollm2, what gemma3_drafter prepares
            drafter = gemma3_drafter(kind, target, tok, draft=draft if kind == "smollm2" else None, **options)
            result = specdecode.generate(target, drafter, ids, eos_token_id=None, max_new_tokens=n, pad_token_id=0)
            out, stats = result.sequences, result.stats
        return time.perf_counter() - start, out, stats

    for name in methods:
        run(name, warm)
    seconds: dict[str, list[list[float]]] = {name: [[] for _ in prompts] for name in methods}
    outputs: dict[str, list[torch.Tensor]] = {name: [] for name in methods}
    pooled: dict[str, list[Any]] = {name: [] for name in methods}
    for round_ in range(args.repeats or 1):
        for i, ids in enumerate(prompts):
            for name in methods:
                took, out, stats = run(name, ids)
                seconds[name][i].append(took)
                if round_ == 0:
                    outputs[name].append(out)
                    if stats is not None:
                        pooled[name].append(stats)
            print(f"round {round_ + 1}, prompt {i + 1}/{len(prompts)}: "
                  + ", ".join(f"{m.split(' (')[0]} {seconds[m][i][-1]:.1f}s" for m in methods), flush=True)

    reference = outputs[ALONE]
    new_tokens = sum(o.shape[1] - p.shape[1] for o, p in zip(reference, prompts))

    def rate(name: str) -> float:
        return new_tokens / sum(statistics.median(s) for s in seconds[name])

    rows = []
    for name in methods:
        stats = pooled[name]
        calls = sum(s.new_tokens for s in stats) / max(1, sum(s.row_steps for s in stats)) if stats else None
        mismatch = sum(not torch.equal(a, b) for a, b in zip(outputs[name], reference))
        per_prompt = [statistics.median(a) / statistics.median(b) for a, b in zip(seconds[ALONE], seconds[name])]
        rows.append({"method": name, "tok/call": calls, "tok/s": rate(name), "x target": rate(name) / rate(ALONE),
                     "x target (median prompt)": statistics.median(per_prompt),
                     "x HF": rate(name) / rate(HF) if HF in methods else None,
                     "x HF UAD": rate(name) / rate(HF_UAD) if HF_UAD in methods else None,
                     "mismatch": mismatch})
    settings = {kind: {**GEMMA3_SETTINGS[kind], **options} for kind, options in variants}
    print(format_table(rows, ["method", "tok/call", "tok/s", "x target", "x target (median prompt)", "x HF",
                              "x HF UAD", "mismatch"],
                       title=f"Gemma 3 270M, {len(prompts)} {args.prompt_set} prompts, batch 1, T=0, {n} new tokens, "
                             f"EOS off, {args.repeats or 1} round(s), threads {torch.get_num_threads()}"))
    write_results(args.out, f"gemma3_pair_{args.prompt_set}", rows, {**vars(args), "settings": settings})
    return rows


if __name__ == "__main__":
    main()
