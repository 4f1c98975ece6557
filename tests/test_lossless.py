"""Losslessness of token, block and greedy verification, by the exact joint-distribution test of
docs/verification.md §8 (Lemma 2 of the block verification paper).

Each test builds a synthetic context-dependent target/draft pair (V = 3..5, gamma = 2..4, its
own random row for every prefix, mixing zeros, one-hots, p == q and near-uniform rows), drafts
N blocks from the draft, verifies all N rows in ONE call (each row an independent sample),
completes every output to gamma+1 tokens from the target's own conditionals, and compares the
empirical joint of those gamma+1 tokens with the exact target joint by a chi-square test with
small cells pooled. A lossless rule must pass (p > 1e-4, fixed seeds); the same harness must
reject deliberately broken rules (p < 1e-8): a test that cannot fail proves nothing.
"""

from __future__ import annotations

import pytest
import torch

import specdecode
import rule_variants as rv
import stat_utils as su

N = 100_000  # samples (rows) per experiment
PASS = 1e-4  # a lossless rule must reach this p-value
FAIL = 1e-8  # a broken rule must fall below this p-value

# (V, gamma, seed): every V in 3..5 and gamma in 2..4 appears.
CONFIGS = [(3, 2, 0), (3, 4, 1), (4, 2, 2), (4, 3, 0), (5, 2, 4), (5, 3, 5), (5, 4, 6), (3, 3, 7)]
# The configuration on which broken rules must fail: one that the built-in rules pass, plain
# and ragged, with exactly the same call.
BROKEN_CFG = (4, 3, 0)
RAGGED_CONFIGS = [(3, 3, 20), (4, 4, 21), (5, 2, 22), BROKEN_CFG]

# Table families that stress one corner each (target kinds, draft relations).
FAMILIES = {
    "p_equals_q": (su.TARGET_ROW_KINDS, ("equal",)),
    "one_hot_targets": (("one_hot",), su.DRAFT_ROW_RELATIONS),
    "one_hot_drafts": (su.TARGET_ROW_KINDS, ("one_hot",)),  # a greedy drafter, sampling target
    "near_uniform": (("near_uniform",), ("near_uniform", "equal")),
    "sparse_disjoint": (("sparse", "one_hot"), ("sparse", "one_hot")),
}


def _cfg_id(cfg):
    return "V{}-g{}-s{}".format(*cfg)


def _assert_lossless(run: su.LosslessRun, what: str) -> None:
    assert run.fit.impossible == 0, f"{what}: emitted a sequence the target gives probability 0 ({run.fit})"
    assert run.fit.pvalue > PASS, f"{what}: output joint differs from the target joint ({run.fit})"


@pytest.mark.parametrize("rule", ["token", "block"])
@pytest.mark.parametrize("cfg", CONFIGS, ids=_cfg_id)
def test_lossless_joint(rule, cfg):
    """Token and block verification preserve the target's joint distribution of gamma+1 tokens
    on random context-dependent tables (docs/verification.md §8)."""
    V, gamma, seed = cfg
    run = su.run_lossless_experiment(su.make_tables(V, gamma, seed), rule, N, seed)
    _assert_lossless(run, f"{rule} {cfg}")


@pytest.mark.parametrize("rule", ["token", "block"])
@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_lossless_table_families(rule, family):
    """Lossless also on the corner cases: p == q everywhere, one-hot targets (temperature 0),
    one-hot drafts (greedy drafter), near-uniform rows, sparse rows with disjoint supports."""
    target_kinds, draft_relations = FAMILIES[family]
    tables = su.make_tables(4, 3, 100 + sorted(FAMILIES).index(family),
                            target_kinds=target_kinds, draft_relations=draft_relations)
    run = su.run_lossless_experiment(tables, rule, N, 11)
    _assert_lossless(run, f"{rule} {family}")
    if family == "p_equals_q":
        assert bool((run.accepted_len == tables.gamma).all()), "p == q must accept every draft"


@pytest.mark.parametrize("rule", ["token", "block"])
@pytest.mark.parametrize("cfg", RAGGED_CONFIGS, ids=_cfg_id)
def test_lossless_ragged(rule, cfg):
    """Rows with fewer drafts (random num_draft_tokens in 0..gamma, unused draft slots holding
    out-of-range ids) are still lossless: the op reads only the first n drafts of a row."""
    V, gamma, seed = cfg
    run = su.run_lossless_experiment(su.make_tables(V, gamma, seed), rule, N, seed, ragged=True)
    _assert_lossless(run, f"{rule} ragged {cfg}")
    assert set(run.num_draft.unique().tolist()) == set(range(gamma + 1))


@pytest.mark.parametrize("rule", ["token", "block"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float64], ids=str)
def test_lossless_other_dtypes(rule, dtype):
    """The half-precision and float64 paths are lossless too (the exact joint is that of the
    rows as rounded to the dtype)."""
    tables = su.make_tables(4, 3, 30).rounded(dtype)
    run = su.run_lossless_experiment(tables, rule, N, 31, dtype=dtype)
    _assert_lossless(run, f"{rule} {dtype}")


@pytest.mark.parametrize("method", ["chi2", "g"])
def test_lossless_g_test_agrees(method):
    """The chi-square and the G test reach the same verdict on a lossless rule (block)."""
    run = su.run_lossless_experiment(su.make_tables(5, 3, 40), "block", N, 41, method=method)
    _assert_lossless(run, f"block ({method})")


# --------------------------------------------------------------------------------- greedy


@pytest.mark.parametrize("ragged", [False, True])
@pytest.mark.parametrize("cfg", [(3, 4, 50), (5, 3, 51)], ids=_cfg_id)
def test_greedy_lossless_at_temperature_zero(cfg, ragged):
    """Greedy verification is exact for the temperature-0 target: with one-hot target rows
    (any draft), the completed output is always the target's one greedy path, and the same
    statistical harness passes."""
    V, gamma, seed = cfg
    tables = su.greedy_target(su.make_tables(V, gamma, seed))
    run = su.run_lossless_experiment(tables, "greedy", 20_000, seed, ragged=ragged, pass_draft=False)
    _assert_lossless(run, f"greedy {cfg}")
    joint = su.exact_joint(tables.target, V, gamma + 1)
    path_cell = int(joint.argmax())
    assert float(joint[path_cell]) == 1.0
    assert bool((su.sequence_cells(run.sequences, V) == path_cell).all())


@pytest.mark.parametrize("cfg", [(4, 3, 52), (5, 4, 53)], ids=_cfg_id)
def test_greedy_output_is_the_argmax_path(cfg):
    """With non-one-hot target rows, greedy verification followed by greedy completion always
    yields the target's argmax path (ties to the lowest id): output == greedy generate."""
    V, gamma, seed = cfg
    tables = su.make_tables(V, gamma, seed)
    gen = torch.Generator().manual_seed(seed)
    drafts = su.draw_drafts(tables, 5000, gen)
    p, _ = su.gather_rows(tables, drafts)
    out = specdecode.verify(p.float(), None, drafts, rule="greedy")
    greedy_tables = su.greedy_target(tables)
    seq = su.complete_with_target(greedy_tables, out.tokens, gen)
    path = []
    for _ in range(gamma + 1):
        row = tables.target[int(tables.index(torch.tensor([path], dtype=torch.int64).view(1, -1)))]
        path.append(int(row.argmax()))
    assert bool((seq == torch.tensor(path)).all())


# ------------------------------------------------------------------- the test can fail

BROKEN_RULES = {
    "token_y_from_p": lambda: rv.make_token_rule(residual=False),
    "token_accept_with_p": lambda: rv.make_token_rule(accept="p"),
    "token_accept_all": lambda: rv.make_token_rule(accept="always"),
    "block_h_equals_w": lambda: rv.make_block_rule(h="w"),
}


@pytest.mark.parametrize("ragged", [False, True])
@pytest.mark.parametrize("name", sorted(BROKEN_RULES))
def test_broken_rules_are_rejected(name, ragged, user_rules):
    """The same harness, same N, rejects broken rules registered through register_rule:
    y ~ p instead of the residual, acceptance with p(x) instead of min(1, p/q), accepting every
    draft, and block verification with h_i = w_i."""
    user_rules(f"broken_{name}", BROKEN_RULES[name](), lossless=False)
    V, gamma, seed = BROKEN_CFG
    run = su.run_lossless_experiment(su.make_tables(V, gamma, seed), f"broken_{name}", N, seed, ragged=ragged)
    assert run.fit.pvalue < FAIL, f"broken rule {name} was not detected ({run.fit})"


@pytest.mark.parametrize("name,factory", [("token", rv.make_token_rule), ("block", rv.make_block_rule)])
def test_pytorch_controls_pass(name, factory, user_rules):
    """Controls: the correct rules written in plain PyTorch (same code as the broken variants
    with the defect switched off) pass the harness, so the broken rules fail for their defect."""
    user_rules(f"control_{name}", factory(), lossless=True)
    V, gamma, seed = BROKEN_CFG
    for ragged in (False, True):
        run = su.run_lossless_experiment(su.make_tables(V, gamma, seed), f"control_{name}", N, seed, ragged=ragged)
        _assert_lossless(run, f"PyTorch {name} control (ragged={ragged})")


def test_harness_catches_zero_probability_outputs(user_rules):
    """A rule that emits a token of target probability 0 is caught outright (impossible > 0,
    p-value 0), whatever its other counts."""

    def argmin_rule(target_probs, draft_probs, draft_tokens, *, num_draft_tokens, uniforms):
        B, gamma = draft_tokens.shape
        tokens = torch.full((B, gamma + 1), -1, dtype=torch.int64)
        tokens[:, 0] = target_probs[:, 0].argmin(-1)
        return tokens, torch.zeros(B, dtype=torch.int64)

    user_rules("argmin_rule", argmin_rule)
    tables = su.make_tables(4, 2, 60, target_kinds=("sparse",))
    run = su.run_lossless_experiment(tables, "argmin_rule", 10_000, 60)
    assert run.fit.impossible > 0 and run.fit.pvalue == 0.0


# ------------------------------------------------------------------- through verify_logits


def _processed(logits: torch.Tensor, temperature: float, top_k: int, min_p: float) -> torch.Tensor:
    """Standardized sampling written here from its definition: softmax(logits / T), keep the
    tokens whose logit ties or beats the k-th largest, keep p(x) >= min_p * max p, renormalise."""
    probs = torch.softmax(logits.double() / temperature, -1)
    keep = torch.ones_like(probs, dtype=torch.bool)
    if top_k:
        kth = logits.double().sort(-1, descending=True).values[..., top_k - 1 : top_k]
        keep &= logits.double() >= kth
    if min_p:
        keep &= probs >= min_p * probs.amax(-1, keepdim=True)
    kept = probs * keep
    return kept / kept.sum(-1, keepdim=True)


@pytest.mark.parametrize("rule", ["token", "block"])
@pytest.mark.parametrize("temperature,top_k,min_p", [(0.7, 3, 0.0), (1.3, 0, 0.2)])
def test_lossless_through_verify_logits(rule, temperature, top_k, min_p):
    """verify_logits (processing inside the op) is lossless for the processed target: drafts
    come from the processed draft, and the output joint equals the processed target's joint."""
    V, gamma, seed = 5, 3, 70
    gen = torch.Generator().manual_seed(seed)
    rows = su.num_prefixes(V, gamma)
    raw = su.PrefixTables(V, gamma, 2.0 * torch.randn(rows, V, generator=gen, dtype=torch.float64),
                          2.0 * torch.randn(rows, V, generator=gen, dtype=torch.float64))
    raw.target[::3] = raw.draft[::3]  # some prefixes with identical target and draft logits
    raw.target, raw.draft = raw.target.float().double(), raw.draft.float().double()
    processed = su.PrefixTables(V, gamma, _processed(raw.target, temperature, top_k, min_p),
                                _processed(raw.draft, temperature, top_k, min_p))

    def via_logits(p, q, drafts, **kwargs):
        target_logits, draft_logits = su.gather_rows(raw, drafts)
        return specdecode.verify_logits(target_logits.float(), draft_logits.float(), drafts,
                                        temperature=temperature, top_k=top_k, min_p=min_p, **kwargs)

    run = su.run_lossless_experiment(processed, rule, N, seed, verify_fn=via_logits)
    _assert_lossless(run, f"{rule} via verify_logits T={temperature} top_k={top_k} min_p={min_p}")


# ------------------------------------------------------------------ the harness itself


@pytest.mark.parametrize("method", ["chi2", "g"])
def test_goodness_of_fit_is_calibrated(method):
    """Under the null (multinomial samples of a distribution with many tiny and some zero
    cells), pooled chi-square / G p-values are roughly uniform: the harness is neither blind
    nor trigger-happy, and pooling keeps every count."""
    gen = torch.Generator().manual_seed(0)
    probs = 0.97 ** torch.arange(400, dtype=torch.float64)
    probs[::7] = 0.0
    probs /= probs.sum()
    pvalues = []
    for _ in range(100):
        counts = torch.bincount(torch.multinomial(probs, 20_000, replacement=True, generator=gen), minlength=400)
        fit = su.goodness_of_fit(counts, probs, method=method)
        assert fit.impossible == 0
        pvalues.append(fit.pvalue)
    pvalues = torch.tensor(pvalues)
    assert float((pvalues < 0.05).double().mean()) <= 0.12
    assert 0.3 <= float((pvalues < 0.5).double().mean()) <= 0.7
    observed, expected = su.pool_cells(counts[probs > 0].double(), probs[probs > 0] * 20_000, 5.0)
    assert float(observed.sum()) == 20_000 and float(expected.sum()) == pytest.approx(20_000)
    assert float(expected.min()) >= 5.0
