"""Tokens per call of built-in rules at T = 1 on the demo pair (chain; fixed 8-node tree), a custom chain
and tree rule, exact-test verdicts. python examples/rule_ablation.py [max_new_tokens=64] [prompts=4] [seeds=3]"""
import sys

import torch

import specdecode
from specdecode.ablation import ablate
from specdecode.demo import demo_prompts
from specdecode.testing import exact_test, exact_tree_test
from specdecode.trees.reference import node_rule_as_tree_rule, normalized_or

TOKENS, PROMPTS, SEEDS = (int(a) for a in sys.argv[1:] + ["64", "4", "3"][len(sys.argv) - 1:])


def power_rule(target_probs, draft_probs, draft_tokens, *, num_draft_tokens, uniforms, power=0.5):
    """Lossy: accept draft i with probability min(1, (p/q)^power); emit a draw from p."""
    B, g = draft_tokens.shape
    p_x = target_probs[:, :g].gather(2, draft_tokens[..., None])[..., 0].double()
    q_x = draft_probs.gather(2, draft_tokens[..., None])[..., 0].double()
    ok = (uniforms[:, :g] < (p_x / q_x) ** power) & (torch.arange(g) < num_draft_tokens[:, None])
    tau = ok.long().cumprod(-1).sum(-1)
    cdf = target_probs[torch.arange(B), tau].double().cumsum(-1)
    y = torch.searchsorted(cdf, uniforms[:, g:] * cdf[:, -1:], right=True).clamp(max=cdf.shape[1] - 1)
    tokens = torch.where(torch.arange(g + 1) < tau[:, None], torch.cat([draft_tokens, draft_tokens[:, :1]], 1), -1)
    return tokens.scatter(1, tau[:, None], y), tau


def top_k_node(p, q, children, chooser, **_):
    """Lossless for deterministic (distinct) children: accept x iff u < R(x), else R(x) = 0."""
    R = list(p)
    for j, (node, x) in enumerate(children):
        if chooser.accept(node, R[x]):
            return ("accept", j)
        R[x] = 0
        R = normalized_or(R, p)
    return ("emit", chooser.sample(R))


specdecode.register_rule("power", power_rule, lossless=False, overwrite=True)
specdecode.register_tree_rule("my_top_k", node_rule_as_tree_rule(top_k_node), lossless=True, overwrite=True,
                              children="deterministic", needs_draft_logits=False)
TREE = [[0], [1], [0, 0], [0, 1], [1, 0], [0, 0, 0], [0, 0, 1]]  # 7 drafts + the root: 8 nodes
chains = ["token", "block", "typical", "top_beta", {"rule": "power", "power": 0.5}]
trees = [{"label": f"tree {r} ({c})", "rule": r, "tree": TREE, "tree_children": c} for r, c in [
    ("rrs", "without_replacement"), ("traversal", "without_replacement"), ("specinfer", "iid"), ("spectr", "iid"),
    ("spechub", "hub"), ("deterministic", "deterministic"), ("my_top_k", "deterministic")]]
target, draft, tok = specdecode.load_demo_pair()
table = ablate(target, draft, demo_prompts(PROMPTS), tokenizer=tok, configs=chains + trees, seeds=range(SEEDS),
               max_new_tokens=TOKENS, temperature=1.0, output="records")
print(f"{'configuration':45s} tokens/call (mean ± sd over {SEEDS} seeds)  acceptance rate")
for row in (r for r in table if r["kind"] == "summary"):
    print(f"{row['config']:45s} {row['tokens_per_call']:.2f} ± {row['tokens_per_call_std']:.2f}"
          f"{row['acceptance_rate']:26.2f}")
verdicts = {"token": exact_test("token"), "block": exact_test("block"), "power": exact_test("power"),
            "tree rrs": exact_tree_test("rrs", children="without_replacement", seed=1),
            "tree my_top_k": exact_tree_test("my_top_k", children="deterministic", num_samples=6000, seed=1)}
for name, verdict in verdicts.items():
    print(f"exact test, {name}: {verdict}")
