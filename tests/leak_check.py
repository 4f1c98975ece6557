"""Resident-memory check of repeated calls, run by ``test_robustness.py`` in a subprocess.

Calls the public ops and entry points many times (verification with several rules, Philox
coins, sampling, and calls that raise ValueError) and prints, as one JSON line, how much the
resident set size (``/proc/self/statm``) grew between the end of a warm-up and the end of the
measured calls. A leak of even one small tensor per call shows up as megabytes over 10^4 calls.

    python tests/leak_check.py --calls 10000          # 10^4 verification + 10^4 sampling calls
    python tests/leak_check.py --leak-bytes 1024      # the same with a deliberate 1 KiB leak per call
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import torch

import specdecode
from specdecode.sampling import SamplingParams, sample_logits

OPS = torch.ops.specdecode
PAGE = os.sysconf("SC_PAGE_SIZE")


def resident_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * PAGE


def make_calls(B: int = 4, gamma: int = 4, V: int = 512):
    """(verification calls, sampling calls): two lists of zero-argument functions."""
    gen = torch.Generator().manual_seed(0)
    target = 3 * torch.randn(B, gamma + 1, V, generator=gen)
    draft = target[:, :gamma] + torch.randn(B, gamma, V, generator=gen)
    tokens = torch.randint(0, V, (B, gamma), generator=gen)
    counts = torch.tensor([gamma, 0, 2, gamma])[:B]
    p, q = torch.softmax(target, -1), torch.softmax(draft, -1)
    seed, offset = torch.tensor([3]), torch.tensor([0])
    logits = 3 * torch.randn(2 * B, V, generator=gen)
    nan_logits = target.clone()
    nan_logits[1, 0, 5] = float("nan")
    params = [SamplingParams(), SamplingParams(0.7, 50, 0.9, 0.0), SamplingParams.greedy()]

    def raises(fn):
        def call():
            try:
                fn()
            except ValueError:
                return
            raise AssertionError("expected ValueError")
        return call

    verify_calls = [
        lambda: specdecode.verify_logits(target, draft, tokens, rule="token", num_draft_tokens=counts, generator=gen),
        lambda: specdecode.verify_logits(target, draft, tokens, rule="block", top_k=20, generator=gen),
        lambda: specdecode.verify_logits(target, None, tokens, rule="typical", philox_seed=seed, philox_offset=offset),
        lambda: specdecode.verify(p, q, tokens, rule="token", generator=gen),
        lambda: specdecode.verify(p, None, tokens, rule="top_beta", beta=2, validate=False, generator=gen),
        lambda: OPS.verify_logits_philox(target, draft, tokens, counts, seed, offset, 1.0, 0, 0.9, 0.0, "block", []),
        raises(lambda: specdecode.verify_logits(nan_logits, draft, tokens, generator=gen)),
        raises(lambda: OPS.verify_logits(target, draft, tokens, counts + 10, torch.rand(B, gamma + 1, dtype=torch.float64),
                                         1.0, 0, 1.0, 0.0, "token", [])),
    ]
    sample_calls = [
        lambda: sample_logits(logits, params[0], generator=gen),
        lambda: sample_logits(logits, params[1], generator=gen),
        lambda: sample_logits(logits, params[2]),
        lambda: OPS.sample_logits_philox(logits, seed, offset, 0.8, 0, 1.0, 0.05),
        raises(lambda: sample_logits(nan_logits[:, 0], params[0])),
    ]
    return verify_calls, sample_calls


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=10000,
                        help="measured calls of each group (verification, sampling), cycling through its kinds")
    parser.add_argument("--warmup", type=int, default=1000, help="warm-up calls of each group")
    parser.add_argument("--leak-bytes", type=int, default=0,
                        help="deliberately keep this many bytes per call (to show that the check sees a leak)")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    groups = make_calls()
    kept = []

    def run(count: int) -> None:
        for group in groups:
            for i in range(count):
                group[i % len(group)]()
                if args.leak_bytes:
                    kept.append(bytearray(args.leak_bytes))

    run(args.warmup)
    before = resident_bytes()
    run(args.calls // 2)
    halfway = resident_bytes()
    run(args.calls - args.calls // 2)
    after = resident_bytes()
    print(json.dumps({"calls_per_group": args.calls, "groups": {"verification": len(groups[0]),
                      "sampling": len(groups[1])}, "rss_before": before, "rss_halfway": halfway,
                      "rss_after": after, "growth": after - before}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
