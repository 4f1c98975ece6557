"""Agreement of a device implementation of the verify / sample ops with the CPU ops, shared by
tests/test_cuda.py (the real GPU) and tests/test_cuda_emulation.py (the CUDA kernels under the
CPU emulator).

Given the same uniforms, the device ops must return the CPU's tokens and accepted lengths,
except where the CPU and the device round a sum differently right at a decision boundary:
  * verify_probs reads the same float64 values on both sides; only summation order differs
    (the CPU sums sequentially, the GPU by chunks and trees, both in float64), so a decision
    can only differ when a coin lies within ~1e-13 of its threshold. Allowed margin: 1e-9.
  * verify_logits / sample_logits compute every weight e = exp((l - max) / T) that enters a
    decision bit-identically, but the normaliser (the CPU sums float32 partials of 2048
    entries; the GPU sums per chunk and rescales) differs by ~1e-7..1e-6 relative, and the
    GPU locates the chunk of an inverse-CDF crossing (and block verification's Z_i) with a fast
    exp (absolute error below ~1e-6 in probability units). Allowed margin: 1e-5.
A mismatching row is accepted only if the float64 reference math (specdecode.reference) puts
the coin of the first disagreeing decision within that margin of its threshold, or, when only
the emitted token differs, puts the device token's CDF interval within that margin of the coin.
Greedy decisions and argmax corrections must agree exactly, and a systematic difference cannot
hide behind the margin (at most max(2, 10%) of the rows may differ).
"""

from __future__ import annotations

import math

import torch

from specdecode import reference

RULES = [
    ("token", []),
    ("block", []),
    ("greedy", []),
    ("typical", [0.09, 0.3, 0.0]),
    ("typical", [0.09, 0.3, 1.0]),  # sample_correction: y ~ p
    ("top_beta", [3.0, 1.0]),
]
PROBS_MARGIN = 1e-9
LOGITS_MARGIN = 1e-5


# ----------------------------------------------------------------------------------- inputs


def logit_inputs(B, gamma, V, dtype, seed, *, ragged=True, noise=0.7, quantize=False):
    """Target logits [B, gamma+1, V], draft logits = target + noise (realistic acceptance),
    drafts sampled from the draft's softmax, ragged num_draft_tokens, uniforms. CPU tensors."""
    g = torch.Generator().manual_seed(seed)
    target = torch.randn(B, gamma + 1, V, generator=g) * 3.0
    draft = target[:, :gamma] + noise * torch.randn(B, gamma, V, generator=g)
    if quantize:  # many exact ties
        target, draft = (target * 2).round() / 2, (draft * 2).round() / 2
    q = torch.softmax(draft.double(), -1)
    drafts = torch.multinomial(q.reshape(-1, V), 1, generator=g).view(B, gamma)
    if ragged:
        num = torch.randint(0, gamma + 1, (B,), generator=g)
        num[0] = gamma
    else:
        num = torch.full((B,), gamma, dtype=torch.int64)
    u = torch.rand(B, gamma + 1, dtype=torch.float64, generator=g)
    return target.to(dtype), draft.to(dtype), drafts, num, u


def prob_inputs(B, gamma, V, dtype, seed, **kw):
    target, draft, drafts, num, u = logit_inputs(B, gamma, V, torch.float32, seed, **kw)
    return torch.softmax(target, -1).to(dtype), torch.softmax(draft, -1).to(dtype), drafts, num, u


def to_device(device, *tensors):
    return [t.to(device) if isinstance(t, torch.Tensor) else t for t in tensors]


# ------------------------------------------------------------- comparing CPU and CUDA results


def _rows_for_reference(op, target, draft, b, n, sampling):
    """float64 processed p [n+1, V] and q [n, V] (or None) of row b, as the reference sees them
    (logits are read through float32, as both kernels do)."""
    t, d = target[b, : n + 1].cpu(), (draft[b, :n].cpu() if draft is not None else None)
    if op == "probs":
        return t.double(), (d.double() if d is not None else None)
    temperature, top_k, top_p, min_p = sampling
    process = lambda x: reference.process_logits(x.float().double(), temperature, top_k, top_p, min_p)  # noqa: E731
    return process(t), (process(d) if d is not None and d.numel() else None)


def _block_h(p, q, x, n):
    w = [1.0]
    for i in range(n):
        w.append(reference.block_weight(w[-1], float(p[i, x[i]]), float(q[i, x[i]])))
    h = []
    for i in range(1, n + 1):
        if i == n:
            h.append(w[n])
            continue
        z = float((w[i] * p[i] - q[i]).clamp_min(0.0).sum())
        denom = z + (1.0 - w[i])
        h.append(z / denom if denom > 0 else 1.0)
    return w, h


def _decision_margin(rule, params, p, q, x, u, n, tau_a, tau_b):
    """Distance between the coin and the threshold of the first decision on which two results
    with accepted lengths tau_a != tau_b disagree (relative for typical / top-beta)."""
    if rule == "block":
        i = max(tau_a, tau_b)  # one side accepted the sub-block of length i, the other did not
        _, h = _block_h(p, q, x, n)
        return abs(float(u[i - 1]) - h[i - 1])
    i = min(tau_a, tau_b)  # both accepted drafts < i; exactly one accepted draft i
    px = float(p[i, x[i]])
    if rule == "token":
        qx = float(q[i, x[i]])
        ratio = px / qx if qx > 0 else (math.inf if px > 0 else 0.0)
        return abs(float(u[i]) - ratio)
    if rule == "typical":
        epsilon, delta = params[0], params[1]
        threshold = min(epsilon, delta * math.exp(-reference.entropy(p[i])))
        return abs(px - threshold) / max(threshold, 1e-300)
    if rule == "top_beta":
        tolerance = params[1]
        if px <= 0.0:
            return 0.0 if float(p[i].max()) == 0.0 else math.inf
        log_gap = abs(math.log(float(p[i].max())) - math.log(px) - tolerance)
        others = torch.arange(p.shape[1]) != x[i]
        near_tie = float(((p[i] - px).abs() / px)[others].min()) if p.shape[1] > 1 else math.inf
        return min(log_gap, near_tie)
    return math.inf  # greedy: decisions are exact


def _emission_margin(rule, params, p, q, x, u_emit, n, tau, y):
    """How far the coin u_emit lies from the CDF interval of token y in the distribution the
    rule samples from at tau (float64 reference), scaled by 1 / its mass; inf when the rule
    emits an argmax (must agree exactly)."""
    if rule == "token":
        weights = p[n] if tau == n else (p[tau] - q[tau]).clamp_min(0.0)
    elif rule == "block":
        w, _ = _block_h(p, q, x, n)
        weights = p[n] if tau == n else (w[tau] * p[tau] - q[tau]).clamp_min(0.0)
    elif rule == "typical" and params[2] != 0.0:
        weights = p[tau]
    else:
        return math.inf
    if float(weights.sum()) <= 0.0:
        weights = p[tau]
    total = float(weights.sum())
    cdf = torch.cumsum(weights, 0) / total
    lo = float(cdf[y - 1]) if y > 0 else 0.0
    hi = float(cdf[y])
    return max(lo - u_emit, u_emit - hi, 0.0) * min(total, 1.0)


def assert_agree(op, rule, params, cpu_out, gpu_out, target, draft, drafts, num, u, sampling=None, margin=None):
    """CPU and CUDA results must be identical except on rows where the reference puts the coin
    of the disagreeing decision within `margin` of its threshold (see the module docstring)."""
    margin = margin if margin is not None else (PROBS_MARGIN if op == "probs" else LOGITS_MARGIN)
    ct, cl = (t.cpu() for t in cpu_out)
    gt, gl = (t.cpu() for t in gpu_out)
    assert gt.shape == ct.shape and gl.shape == cl.shape and gt.dtype == gl.dtype == torch.int64
    bad_rows = torch.nonzero((ct != gt).any(1) | (cl != gl)).flatten().tolist()
    gamma = drafts.shape[1]
    for b in bad_rows:
        n = int(num[b])
        tau_c, tau_g = int(cl[b]), int(gl[b])
        p, q = _rows_for_reference(op, target, draft, b, n, sampling)
        x = drafts[b, :n].tolist()
        row_u = u[b].cpu()
        if tau_c != tau_g:
            m = _decision_margin(rule, params, p, q, x, row_u, n, tau_c, tau_g)
            what = f"accepted {tau_c} (CPU) vs {tau_g} (CUDA)"
        else:
            assert torch.equal(ct[b, :tau_c], gt[b, :tau_g]), f"row {b}: accepted prefixes differ"
            m = _emission_margin(rule, params, p, q, x, float(row_u[gamma]), n, tau_g, int(gt[b, tau_g]))
            what = f"emitted {int(ct[b, tau_c])} (CPU) vs {int(gt[b, tau_g])} (CUDA) after {tau_c} accepted"
        assert m <= margin, (
            f"{op} {rule} {params} {sampling or ''}: row {b} of {len(cl)}: {what}, but the coin is {m:.3g} from "
            f"the decision boundary (allowed {margin:g}); CPU {ct[b].tolist()} CUDA {gt[b].tolist()}"
        )
    # Boundary cases are rare: a systematic difference must not hide behind the margin.
    assert len(bad_rows) <= max(2, len(cl) // 10), f"{op} {rule}: {len(bad_rows)} of {len(cl)} rows differ"




def assert_samples_agree(cpu_tokens, dev_tokens, logits, uniforms, sampling, margin=LOGITS_MARGIN):
    """sample_logits on the device vs the CPU: the same tokens, except rows where the float64
    reference puts the device token's CDF interval within `margin` of the coin; greedy
    (temperature 0) must agree exactly; a device token always has positive probability."""
    ct, dt = cpu_tokens.cpu(), dev_tokens.cpu()
    assert dt.shape == ct.shape and dt.dtype == torch.int64
    bad_rows = torch.nonzero(ct != dt).flatten().tolist()
    for b in bad_rows:
        assert sampling[0] != 0.0, f"greedy sample differs in row {b}: CPU {int(ct[b])} device {int(dt[b])}"
        p = reference.process_logits(logits[b].cpu().float().double(), *sampling)
        y = int(dt[b])
        assert float(p[y]) > 0.0, f"row {b}: the device sampled token {y} of probability 0"
        cdf = torch.cumsum(p, 0) / float(p.sum())
        lo = float(cdf[y - 1]) if y > 0 else 0.0
        u = float(uniforms[b])
        m = max(lo - u, u - float(cdf[y]), 0.0)
        assert m <= margin, f"row {b}: CPU {int(ct[b])} device {y}, coin {m:.3g} from the interval (allowed {margin:g})"
    assert len(bad_rows) <= max(2, len(ct) // 10), f"{len(bad_rows)} of {len(ct)} samples differ"


# ------------------------------------------------------------------------------ token trees
# verify_tree on a device vs the CPU. The same decisions as the chain ops, with the same
# rounding differences (LOGITS_MARGIN): every p(x), q(x) and filter threshold is exact, the
# normaliser and the float64 residual / entropy masses differ in summation order only. A
# mismatching row (tokens, accepted length or accepted nodes) is accepted only if the float64
# tree reference puts one of the row's decisions within the margin of its boundary: a coin
# (specdecode.trees.reference.CoinChooser.margin: acceptance ratios and inverse-CDF steps) or,
# for typical acceptance, a child's p(x) relative to the entropy threshold. Greedy walks and
# argmax emissions must agree exactly; at most max(2, 10%) of the rows may differ.

TREE_RULES = [
    ("greedy", []),
    ("specinfer", []),
    ("rrs", []),
    ("deterministic", []),
    ("typical", [0.3, 0.6, 0.0]),
    ("typical", [0.05, 0.1, 1.0]),  # sample_correction: y ~ p
    ("spectr", []),
    ("spechub", []),
    ("traversal", []),
    ("traversal_iid", []),
]
#: The rules for trees of K paths of one length below the root (paths_logit_inputs).
PATH_RULES = [("gbv", [])]
#: Compiled tree rules whose reference is a row function (specdecode.trees.python_rules).
ROW_FUNCTION_RULES = ("spectr", "spechub", "traversal", "traversal_iid", "gbv")


def tree_needs_draft(rule: str) -> bool:
    return rule in ("specinfer", "rrs") + ROW_FUNCTION_RULES


def paths_logit_inputs(B, V, dtype, seed, *, max_paths=4, max_length=3, sampling=(1.0, 0, 1.0, 0.0)):
    """Rows of K paths of one length L below the root (K in 0..max_paths, at least 1 in row 0,
    L in 1..max_length, random per row; path j's nodes at slots 1 + j L .. j L + L), tokens
    drawn from the draft's processed distribution at the parent, a path often repeating the
    previous one's first tokens (so the set of agreeing paths shrinks step by step); padding
    slots hang off the root. N = 1 + max_paths * max_length. Returns (target, draft, tokens,
    parents, num_nodes, uniforms) as tree_logit_inputs does."""
    gen = torch.Generator().manual_seed(seed)
    N = 1 + max_paths * max_length
    target = 3.0 * torch.randn(B, N, V, generator=gen)
    draft = target + torch.randn(B, N, V, generator=gen)
    q = reference.process_logits(draft.double(), *sampling) if sampling[0] > 0 else torch.softmax(draft.double(), -1)
    tokens = torch.zeros(B, N, dtype=torch.int64)
    parents = torch.zeros(B, N, dtype=torch.int64)
    parents[:, 0] = -1
    num_nodes = torch.ones(B, dtype=torch.int64)
    for b in range(B):
        K = int(torch.randint(0 if b else 1, max_paths + 1, (1,), generator=gen))
        L = int(torch.randint(1, max_length + 1, (1,), generator=gen))
        num_nodes[b] = 1 + K * L
        for j in range(K):
            shared = int(torch.randint(0, L + 1, (1,), generator=gen)) if j else 0
            for i in range(L):
                node = 1 + j * L + i
                parent = 0 if i == 0 else node - 1
                parents[b, node] = parent
                if i < shared and int(torch.randint(0, 2, (1,), generator=gen)):
                    tokens[b, node] = tokens[b, node - L]
                else:
                    tokens[b, node] = torch.multinomial(q[b, parent] + 1e-12, 1, generator=gen)[0]
                    shared = i
    u = torch.rand(B, N, dtype=torch.float64, generator=gen)
    u[torch.rand(B, N, generator=gen) < 0.03] = 0.0
    return target.to(dtype), draft.to(dtype), tokens, parents, num_nodes, u


def _row_function_margins(rule, t, d, tree, u, sampling) -> list[float]:
    """CoinChooser margins of the row function of ``rule`` on the float64 reference's
    processed distributions, one per row."""
    from specdecode.trees.python_rules import ROW_RULES
    from specdecode.trees.reference import CoinChooser

    margins = []
    for b in range(tree.batch_size):
        n = int(tree.num_nodes[b])
        p = reference.process_logits(t[b, :n], *sampling).tolist()
        q = reference.process_logits(d[b, :n], *sampling).tolist()
        chooser = CoinChooser(u[b].tolist())
        ROW_RULES[rule](p, q, tree.tokens[b, :n].tolist(), tree.parents[b, :n].tolist(), n, chooser)
        margins.append(chooser.margin)
    return margins


def tree_logit_inputs(B, N, V, dtype, seed, *, max_children=3, related=True, sampling=(1.0, 0, 1.0, 0.0)):
    """Random ragged trees (at most ``max_children`` children per node) whose siblings are
    distinct tokens drawn without replacement from the draft's processed distribution at their
    parent (some replaced by the target's argmax), peaked logits (the draft correlated with the
    target unless ``related`` is False), coins with a few exact zeros. Padding slots hold
    garbage tokens and parents. Returns (target, draft, tokens, parents, num_nodes, uniforms),
    CPU tensors; logits in ``dtype``."""
    gen = torch.Generator().manual_seed(seed)
    target = 3.0 * torch.randn(B, N, V, generator=gen)
    noise = torch.randn(B, N, V, generator=gen)
    draft = target + noise if related else 2.0 * noise
    q = reference.process_logits(draft.double(), *sampling) if sampling[0] > 0 else torch.softmax(draft.double(), -1)
    parents = torch.randint(-3, N + 3, (B, N), generator=gen)
    tokens = torch.randint(-5, V + 5, (B, N), generator=gen)
    num_nodes = torch.randint(1, N + 1, (B,), generator=gen)
    num_nodes[0] = N
    for b in range(B):
        n = int(num_nodes[b])
        parents[b, 0] = -1
        counts = [0] * n
        children: list[list[int]] = [[] for _ in range(n)]
        for i in range(1, n):
            open_nodes = [v for v in range(i) if counts[v] < min(max_children, V)]
            parent = open_nodes[int(torch.randint(len(open_nodes), (1,), generator=gen))]
            parents[b, i] = parent
            counts[parent] += 1
            children[parent].append(i)
        for v in range(n):
            if children[v]:
                weights = q[b, v] + 1e-3  # every token possible: k distinct ones exist
                drawn = torch.multinomial(weights, len(children[v]), replacement=False, generator=gen)
                if related and float(torch.rand(1, generator=gen)) < 0.4:
                    best = int(target[b, v].argmax())
                    if best not in drawn.tolist():
                        drawn[0] = best
                tokens[b, children[v]] = drawn
    u = torch.rand(B, N, dtype=torch.float64, generator=gen)
    u[torch.rand(B, N, generator=gen) < 0.03] = 0.0
    return target.to(dtype), draft.to(dtype), tokens, parents, num_nodes, u


def _tree_options(rule, params):
    if rule == "typical":
        return {"epsilon": params[0], "delta": params[1], "sample_correction": bool(params[2])}
    return {}


def _typical_margin(p_rows, tokens, parents, n, params) -> float:
    """The smallest |p_v(x) - threshold_v| / threshold_v over every child x of every real node v."""
    epsilon, delta = params[0], params[1]
    margin = math.inf
    for i in range(1, n):
        v = int(parents[i])
        p = p_rows[v]
        threshold = min(epsilon, delta * math.exp(-reference.entropy(p)))
        margin = min(margin, abs(float(p[int(tokens[i])]) - threshold) / max(threshold, 1e-300))
    return margin


def assert_tree_agree(rule, params, cpu_out, dev_out, target, draft, tokens, parents, num_nodes, u, sampling,
                      margin=LOGITS_MARGIN):
    """CPU and device verify_tree results must be identical except on rows where the float64
    reference puts a decision of the row within `margin` of its boundary (see above)."""
    from specdecode.sampling import SamplingParams
    from specdecode.trees import TokenTree
    from specdecode.trees.reference import verify_tree_logits_reference

    cpu = [t.cpu() for t in cpu_out]
    dev = [t.cpu() for t in dev_out]
    for c, d in zip(cpu, dev):
        assert c.shape == d.shape and d.dtype == torch.int64, (c.shape, d.shape, d.dtype)
    differ = ~((cpu[0] == dev[0]).all(1) & (cpu[1] == dev[1]) & (cpu[2] == dev[2]).all(1))
    bad_rows = torch.nonzero(differ).flatten().tolist()
    if not bad_rows:
        return
    b0 = bad_rows[0]
    assert rule != "greedy" and sampling[0] != 0.0, (
        f"{rule} {sampling}: the greedy walk differs in row {b0}: CPU {cpu[0][b0].tolist()} device {dev[0][b0].tolist()}")
    t, d = target.cpu().float().double(), (draft.cpu().float().double() if draft is not None else None)
    rows = torch.tensor(bad_rows)
    tree = TokenTree(tokens[rows].cpu(), parents[rows].cpu(), num_nodes[rows].cpu())
    margins: list[float] = []
    params_obj = SamplingParams(*sampling)
    if rule in ROW_FUNCTION_RULES:
        margins = _row_function_margins(rule, t[rows], d[rows], tree, u[rows].cpu(), sampling)
    else:
        verify_tree_logits_reference(t[rows], d[rows] if d is not None else None, tree, rule=rule,
                                     uniforms=u[rows].cpu(), sampling=params_obj, margins=margins,
                                     **_tree_options(rule, params))
    for k, b in enumerate(bad_rows):
        m = margins[k]
        n = int(num_nodes[b])
        if rule == "typical":
            p_rows = reference.process_logits(t[b, :n], *sampling)
            m = min(m, _typical_margin(p_rows, tokens[b].cpu(), parents[b].cpu(), n, params))
        assert m <= margin, (
            f"verify_tree {rule} {params} {sampling}: row {b} of {len(differ)}: CPU tokens {cpu[0][b].tolist()} nodes "
            f"{cpu[2][b].tolist()} vs device {dev[0][b].tolist()} nodes {dev[2][b].tolist()}, but the nearest "
            f"decision is {m:.3g} from its boundary (allowed {margin:g})")
    assert len(bad_rows) <= max(2, len(differ) // 10), f"verify_tree {rule}: {len(bad_rows)} of {len(differ)} rows differ"


def assert_processed_probs_agree(cpu_probs, dev_probs, greedy):
    """processed_probs on a device vs the CPU: the same support exactly, values within float64
    summation rounding (both divide the same exact p(x) by their own sum; the normaliser's
    rounding cancels in that division); greedy one-hot rows exactly."""
    c, d = cpu_probs.cpu(), dev_probs.cpu()
    assert d.shape == c.shape and d.dtype == torch.float64
    assert torch.equal(c > 0, d > 0), "the supports differ"
    if greedy:
        assert torch.equal(c, d)
    else:
        torch.testing.assert_close(d, c, rtol=1e-12, atol=1e-300)
