"""Every error a direct call of the verify / sample / tree-verify / processed_probs ops can raise
(``torch.ops.specdecode.*``),
as a catalogue of small bad calls that can run on any device and on any implementation with the
ops' signatures (the CPU / CUDA ops, or the CUDA kernels under the CPU emulator).

``run_cases(device, ops)`` runs every case and returns ``{name: [exception type, first line of
its message]}`` (``[None, None]`` when the call returned): a device implementation must produce
exactly the CPU op's entry for every case. ``device_cases`` are the mixed-device mistakes,
which only a machine with a GPU can make; they must raise a ValueError naming the device.

Run as a script (``python tests/op_error_cases.py cuda``) it prints the JSON of
``run_cases(device)`` for the real ops: tests/test_cuda.py runs that in a subprocess, so a crash
fails one test instead of killing pytest.
"""

from __future__ import annotations

import json
import math
import sys
from typing import Any, Callable

import torch

B, GAMMA, V = 2, 3, 7
TREE_N = 4


def _inputs(device: str) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(11)
    logits = torch.randn(B, GAMMA + 1, V, generator=g) * 2
    draft_logits = logits[:, :GAMMA] + 0.5 * torch.randn(B, GAMMA, V, generator=g)
    tokens = torch.tensor([[1, 2, 3], [4, 5, 6]])
    inputs = {
        "logits": logits,
        "draft_logits": draft_logits,
        "probs": torch.softmax(logits, -1),
        "draft_probs": torch.softmax(draft_logits, -1),
        "tokens": tokens,
        "num": torch.tensor([GAMMA, 2]),
        "u": torch.rand(B, GAMMA + 1, dtype=torch.float64, generator=g) * 0.5,
        "seed": torch.tensor([5]),
        "offset": torch.tensor([1]),
        "sample_logits": torch.randn(B, V, generator=g),
        "sample_u": torch.rand(B, dtype=torch.float64, generator=g),
        # one tree per row: [B, TREE_N] node slots, row 1 ragged (3 real nodes)
        "tree_target": torch.randn(B, TREE_N, V, generator=g) * 2,
        "tree_draft": torch.randn(B, TREE_N, V, generator=g) * 2,
        "tree_tokens": torch.tensor([[0, 1, 2, 3], [4, 0, 1, 2]]),
        "parents": torch.tensor([[-1, 0, 0, 1], [-1, 0, 1, 1]]),
        "num_nodes": torch.tensor([TREE_N, 3]),
        "tree_u": torch.rand(B, TREE_N, dtype=torch.float64, generator=g),
    }
    return {k: v.to(device) for k, v in inputs.items()}


def _set(t: torch.Tensor, index: tuple, value: float) -> torch.Tensor:
    t = t.clone()
    t[index] = value
    return t


PLAIN = (1.0, 0, 1.0, 0.0)


def cases(device: str) -> list[tuple[str, Callable[[Any], Any]]]:
    """(name, call(ops)) for every error, plus a few calls that must NOT raise."""
    x = _inputs(device)
    p, q, t, d = x["probs"], x["draft_probs"], x["logits"], x["draft_logits"]
    tok, num, u, seed, off = x["tokens"], x["num"], x["u"], x["seed"], x["offset"]
    sl, su = x["sample_logits"], x["sample_u"]
    out: list[tuple[str, Callable[[Any], Any]]] = []

    def probs(name, target=p, draft=q, tokens=tok, n=num, uniforms=u, rule="token", params=()):
        out.append((f"verify_probs/{name}", lambda ops: ops.verify_probs(target, draft, tokens, n, uniforms, rule,
                                                                          list(params))))

    def logits(name, target=t, draft=d, tokens=tok, n=num, uniforms=u, sampling=PLAIN, rule="token", params=()):
        out.append((f"verify_logits/{name}", lambda ops: ops.verify_logits(target, draft, tokens, n, uniforms,
                                                                            *sampling, rule, list(params))))

    def probs_philox(name, target=p, draft=q, tokens=tok, n=num, s=seed, o=off, rule="token", params=()):
        out.append((f"verify_probs_philox/{name}",
                    lambda ops: ops.verify_probs_philox(target, draft, tokens, n, s, o, rule, list(params))))

    def logits_philox(name, target=t, draft=d, tokens=tok, n=num, s=seed, o=off, sampling=PLAIN, rule="token",
                      params=()):
        out.append((f"verify_logits_philox/{name}",
                    lambda ops: ops.verify_logits_philox(target, draft, tokens, n, s, o, *sampling, rule,
                                                         list(params))))

    def tree(name, target=x["tree_target"], draft=x["tree_draft"], tokens=x["tree_tokens"], parents=x["parents"],
             n=x["num_nodes"], uniforms=x["tree_u"], sampling=PLAIN, rule="specinfer", params=()):
        out.append((f"verify_tree/{name}", lambda ops: ops.verify_tree(target, draft, tokens, parents, n, uniforms,
                                                                        *sampling, rule, list(params))))

    def tree_philox(name, target=x["tree_target"], draft=x["tree_draft"], tokens=x["tree_tokens"],
                    parents=x["parents"], n=x["num_nodes"], s=seed, o=off, sampling=PLAIN, rule="rrs", params=()):
        out.append((f"verify_tree_philox/{name}",
                    lambda ops: ops.verify_tree_philox(target, draft, tokens, parents, n, s, o, *sampling, rule,
                                                       list(params))))

    def processed(name, lg=sl, sampling=PLAIN):
        out.append((f"processed_probs/{name}", lambda ops: ops.processed_probs(lg, *sampling)))

    def sample(name, lg=sl, uniforms=su, sampling=PLAIN):
        out.append((f"sample_logits/{name}", lambda ops: ops.sample_logits(lg, uniforms, *sampling)))

    def sample_philox(name, lg=sl, s=seed, o=off, sampling=PLAIN):
        out.append((f"sample_logits_philox/{name}", lambda ops: ops.sample_logits_philox(lg, s, o, *sampling)))

    # --- rule and its parameters
    probs("unknown_rule", rule="nope")
    probs("typical_param_count", rule="typical", params=[0.1])
    probs("typical_negative", rule="typical", params=[-0.1, 0.3, 0.0])
    probs("top_beta_param_count", rule="top_beta", params=[1.0])
    probs("top_beta_fractional_beta", rule="top_beta", params=[1.5, 0.0])
    probs("top_beta_zero_beta", rule="top_beta", params=[0.0, 0.0])
    probs("top_beta_negative_tolerance", rule="top_beta", params=[2.0, -1.0])
    probs("token_with_params", params=[1.0])
    # --- shapes and dtypes
    probs("target_2d", target=p[:, 0])
    probs("target_int", target=p.int())
    probs("tokens_1d", tokens=tok[:, 0])
    probs("tokens_float", tokens=tok.float())
    probs("gamma_0", target=p[:, :1], draft=q[:, :0], tokens=tok[:, :0], uniforms=u[:, :1])
    probs("vocab_0", target=p[..., :0], draft=q[..., :0])
    probs("tokens_batch", tokens=torch.cat([tok, tok[:1]]))
    probs("target_gamma", target=torch.cat([p, p[:, :1]], 1))
    probs("draft_shape", draft=q[:, :2])
    probs("draft_dtype", draft=q.double())
    probs("draft_missing", draft=None)
    probs("draft_missing_block", draft=None, rule="block")
    probs("num_shape", n=torch.cat([num, num[:1]]))
    probs("num_int32", n=num.int())
    probs("uniforms_shape", uniforms=u[:, :2])
    probs("uniforms_float32", uniforms=u.float())
    # --- bad rows (raised per row, after the kernels ran)
    probs("token_out_of_range", tokens=_set(tok, (1, 1), V))
    probs("token_negative", tokens=_set(tok, (0, 2), -1))
    probs("num_above_gamma", n=_set(num, (1,), GAMMA + 1))
    probs("num_negative", n=_set(num, (0,), -1))
    zero_row = p.clone()
    zero_row[1, 0] = 0.0
    probs("empty_emission", target=zero_row, n=_set(num, (1,), 0))
    probs("empty_emission_typical", target=zero_row, n=_set(num, (1,), 0), rule="typical", params=[0.09, 0.3, 1.0])
    probs("ok_token")
    probs("ok_greedy", draft=None, rule="greedy")

    for rule, params in [("token", ()), ("block", ()), ("greedy", ()), ("typical", (0.09, 0.3, 0.0)),
                         ("top_beta", (2.0, 1.0))]:
        dr = d if rule in ("token", "block") else None
        logits(f"{rule}/nan_target", target=_set(t, (1, 0, 3), math.nan), draft=dr, rule=rule, params=params)
        logits(f"{rule}/inf_target", target=_set(t, (0, 0, 2), math.inf), draft=dr, rule=rule, params=params)
        logits(f"{rule}/all_masked", target=_set(t, (0, 0), -math.inf), draft=dr, rule=rule, params=params)
        logits(f"{rule}/ok", draft=dr, rule=rule, params=params)
    logits("token/inf_draft", draft=_set(d, (1, 0, 5), math.inf))
    logits("block/nan_draft", draft=_set(d, (0, 1, 0), math.nan), rule="block")
    logits("token/filters_nan", target=_set(t, (0, 0, 1), math.nan), sampling=(0.8, 3, 0.9, 0.05))
    logits("temperature_negative", sampling=(-1.0, 0, 1.0, 0.0))
    logits("temperature_inf", sampling=(math.inf, 0, 1.0, 0.0))
    logits("temperature_nan", sampling=(math.nan, 0, 1.0, 0.0))
    logits("top_k_negative", sampling=(1.0, -1, 1.0, 0.0))
    logits("top_p_zero", sampling=(1.0, 0, 0.0, 0.0))
    logits("top_p_above_1", sampling=(1.0, 0, 1.5, 0.0))
    logits("min_p_negative", sampling=(1.0, 0, 1.0, -0.1))
    logits("min_p_above_1", sampling=(1.0, 0, 1.0, 1.5))
    logits("greedy_at_temperature_0_nan", target=_set(t, (1, 0, 0), math.nan), sampling=(0.0, 0, 1.0, 0.0))
    logits("unknown_rule", rule="nope")
    logits("target_float16_draft_float32", target=t.half())
    logits("token_out_of_range", tokens=_set(tok, (0, 0), V + 3))

    probs_philox("seed_float", s=seed.float())
    probs_philox("seed_two", s=torch.cat([seed, seed]))
    probs_philox("offset_two", o=torch.cat([off, off]))
    probs_philox("tokens_1d", tokens=tok[:, 0])
    probs_philox("unknown_rule", rule="nope")
    probs_philox("draft_shape", draft=q[:, :2])
    probs_philox("token_out_of_range", tokens=_set(tok, (1, 2), V))
    probs_philox("ok")
    logits_philox("offset_int32", o=off.int())
    logits_philox("top_p_zero", sampling=(1.0, 0, 0.0, 0.0))
    logits_philox("nan_target", target=_set(t, (0, 1, 1), math.nan))
    logits_philox("ok", sampling=(0.7, 3, 0.8, 0.0))

    sample("logits_1d", lg=sl[0])
    sample("logits_int", lg=sl.int())
    sample("vocab_0", lg=sl[:, :0])
    sample("uniforms_shape", uniforms=su[:1])
    sample("uniforms_float32", uniforms=su.float())
    sample("temperature_negative", sampling=(-0.5, 0, 1.0, 0.0))
    sample("top_p_zero", sampling=(1.0, 0, 0.0, 0.0))
    sample("nan_row", lg=_set(sl, (1, 2), math.nan))
    sample("inf_row", lg=_set(sl, (0, 2), math.inf))
    sample("all_masked_row", lg=_set(sl, (1,), -math.inf))
    sample("greedy_nan_row", lg=_set(sl, (0, 0), math.nan), sampling=(0.0, 0, 1.0, 0.0))
    sample("filters_all_masked", lg=_set(sl, (0,), -math.inf), sampling=(0.8, 3, 0.9, 0.05))
    sample("ok")
    sample("ok_empty_batch", lg=sl[:0], uniforms=su[:0])
    sample_philox("seed_two", s=torch.cat([seed, seed]))
    sample_philox("offset_float", o=off.double())
    sample_philox("logits_1d", lg=sl[0])
    sample_philox("nan_row", lg=_set(sl, (1, 0), math.nan))
    sample_philox("ok", sampling=(0.9, 0, 0.9, 0.0))

    tt, td, ttok, tpar, tn = x["tree_target"], x["tree_draft"], x["tree_tokens"], x["parents"], x["num_nodes"]
    # --- rule, parameters, sampling settings
    tree("unknown_rule", rule="token")
    tree("rule_params_for_rrs", rule="rrs", params=[1.0])
    tree("typical_param_count", rule="typical", params=[0.1])
    tree("typical_negative", rule="typical", params=[0.1, -0.3, 0.0])
    tree("temperature_nan", sampling=(math.nan, 0, 1.0, 0.0))
    tree("top_k_negative", sampling=(1.0, -2, 1.0, 0.0))
    tree("top_p_zero", sampling=(1.0, 0, 0.0, 0.0))
    tree("min_p_above_1", sampling=(1.0, 0, 1.0, 1.5))
    # --- shapes and dtypes
    tree("target_2d", target=tt[0])
    tree("target_int", target=tt.int())
    tree("target_nodes", target=tt[:, :3])
    tree("vocab_0", target=tt[..., :0], draft=td[..., :0])
    tree("draft_missing", draft=None)
    tree("draft_missing_rrs", draft=None, rule="rrs")
    tree("draft_vocab", draft=td[..., :5])
    tree("draft_dtype", draft=td.double())
    tree("tokens_shape", tokens=ttok[:, :3])
    tree("tokens_int32", tokens=ttok.int())
    tree("parents_1d", parents=tpar[0])
    tree("parents_float", parents=tpar.float())
    tree("too_many_nodes", parents=torch.full((B, 4097), -1, device=device))
    tree("num_nodes_shape", n=tn[:1])
    tree("num_nodes_int32", n=tn.int())
    tree("uniforms_shape", uniforms=x["tree_u"][:, :3])
    tree("uniforms_float32", uniforms=x["tree_u"].float())
    # --- bad rows (raised per row, after the kernels ran)
    tree("num_nodes_zero", n=_set(tn, (0,), 0))
    tree("num_nodes_above", n=_set(tn, (1,), TREE_N + 1))
    tree("bad_root", parents=_set(tpar, (1, 0), 0))
    tree("bad_parent", parents=_set(tpar, (0, 2), 2))
    tree("parent_huge", parents=_set(tpar, (0, 3), 2**40))
    tree("token_out_of_range", tokens=_set(ttok, (0, 2), V))
    tree("token_negative", tokens=_set(ttok, (1, 1), -1))
    tree("token_out_of_range_in_padding_is_ok", tokens=_set(ttok, (1, 3), -7))
    tree("duplicate_siblings_rrs", tokens=_set(ttok, (0, 2), 1), rule="rrs")
    tree("duplicate_siblings_deterministic", tokens=_set(ttok, (0, 1), 2), rule="deterministic", draft=None)
    tree("duplicate_siblings_in_padding_is_ok", tokens=_set(ttok, (1, 3), 1), rule="rrs")
    tree("duplicate_siblings_specinfer_is_ok", tokens=_set(ttok, (0, 2), 1))
    tree("token_range_before_duplicates", tokens=_set(_set(ttok, (0, 2), 1), (1, 1), V), rule="rrs")
    tree("nan_target_root", target=_set(tt, (1, 0, 3), math.nan))
    tree("inf_target_root_greedy", target=_set(tt, (0, 0, 2), math.inf), rule="greedy", draft=None)
    tree("nan_target_root_temperature_0", target=_set(tt, (0, 0, 2), math.nan), sampling=(0.0, 0, 1.0, 0.0),
         draft=None)
    tree("all_masked_target_root", target=_set(tt, (0, 0), -math.inf), rule="deterministic", draft=None)
    tree("all_masked_target_root_filters", target=_set(tt, (0, 0), -math.inf), sampling=(0.8, 3, 0.9, 0.05))
    tree("inf_draft_root", draft=_set(td, (1, 0, 2), math.inf))
    tree("nan_draft_root_rrs", draft=_set(td, (0, 0, 2), math.nan), rule="rrs")
    tree("nan_draft_at_a_leaf_is_ok", draft=_set(td, (0, 3, 2), math.nan), uniforms=torch.zeros_like(x["tree_u"]))
    tree("nan_in_padding_is_ok", target=_set(tt, (1, 3, 0), math.nan), draft=_set(td, (1, 3, 1), math.nan))
    tree("nan_typical_root", target=_set(tt, (1, 0, 0), math.nan), rule="typical", params=[0.09, 0.3, 0.0],
         draft=None)
    tree("duplicate_siblings_traversal", tokens=_set(ttok, (0, 2), 1), rule="traversal")
    star = torch.zeros_like(tpar)  # row 0: three paths of one node; row 1 (3 nodes): two
    star[:, 0] = -1
    tree("gbv_not_paths", rule="gbv")
    tree("gbv_not_paths_row_1", rule="gbv", parents=_set(star, (1, 2), 1))
    tree("draft_missing_gbv", rule="gbv", draft=None, parents=star)
    tree("nan_draft_root_gbv", rule="gbv", parents=star, draft=_set(td, (0, 0, 2), math.nan))
    tree("nan_target_leaf_gbv", rule="gbv", parents=star, target=_set(tt, (1, 1, 2), math.nan),
         uniforms=torch.zeros_like(x["tree_u"]))
    tree("ok_gbv", rule="gbv", parents=star)
    tree("ok_gbv_filters", rule="gbv", parents=star, sampling=(0.7, 3, 0.9, 0.05))
    tree_philox("ok_gbv", rule="gbv", parents=star)
    for rule in ("spectr", "spechub", "traversal", "traversal_iid"):
        tree(f"draft_missing_{rule}", draft=None, rule=rule)
        tree(f"rule_params_for_{rule}", rule=rule, params=[2.0])
        tree(f"token_out_of_range_{rule}", tokens=_set(ttok, (0, 2), V), rule=rule)
        if rule != "traversal":
            tree(f"duplicate_siblings_{rule}_is_ok", tokens=_set(ttok, (0, 2), 1), rule=rule)
        tree(f"nan_target_root_{rule}", target=_set(tt, (1, 0, 3), math.nan), rule=rule)
        tree(f"nan_draft_root_{rule}", draft=_set(td, (0, 0, 2), math.nan), rule=rule)
        tree(f"all_masked_draft_root_{rule}", draft=_set(td, (1, 0), -math.inf), rule=rule)
        tree(f"nan_draft_at_a_leaf_is_ok_{rule}", draft=_set(td, (0, 3, 2), math.nan), rule=rule,
             uniforms=torch.zeros_like(x["tree_u"]))
        tree_philox(f"nan_target_{rule}", target=_set(tt, (1, 0, 1), math.nan), rule=rule)
    for rule, params in [("greedy", ()), ("specinfer", ()), ("rrs", ()), ("deterministic", ()),
                         ("typical", (0.09, 0.3, 0.0)), ("typical", (0.09, 0.3, 1.0)), ("spectr", ()),
                         ("spechub", ()), ("traversal", ()), ("traversal_iid", ())]:
        tree(f"ok_{rule}_{len(params) and params[2]}", rule=rule, params=params,
             draft=td if rule in ("specinfer", "rrs", "spectr", "spechub", "traversal", "traversal_iid") else None)
    for rule in ("spectr", "spechub", "traversal", "traversal_iid"):
        tree(f"ok_filters_{rule}", sampling=(0.7, 3, 0.9, 0.05), rule=rule)
    tree("ok_filters", sampling=(0.7, 3, 0.9, 0.05), rule="rrs")
    tree("ok_empty_batch", target=tt[:0], draft=td[:0], tokens=ttok[:0], parents=tpar[:0], n=tn[:0],
         uniforms=x["tree_u"][:0])
    tree_philox("seed_two", s=torch.cat([seed, seed]))
    tree_philox("offset_float", o=off.double())
    tree_philox("parents_1d", parents=tpar[0])
    tree_philox("unknown_rule", rule="block")
    tree_philox("nan_target", target=_set(tt, (1, 0, 1), math.nan))
    tree_philox("duplicate_siblings", tokens=_set(ttok, (0, 2), 1))
    tree_philox("ok", sampling=(0.9, 5, 0.9, 0.0))

    processed("logits_1d", lg=sl[0])
    processed("logits_3d", lg=sl[None])
    processed("logits_int", lg=sl.int())
    processed("vocab_0", lg=sl[:, :0])
    processed("temperature_negative", sampling=(-1.0, 0, 1.0, 0.0))
    processed("top_p_zero", sampling=(1.0, 0, 0.0, 0.0))
    processed("nan_row", lg=_set(sl, (1, 2), math.nan))
    processed("inf_row_greedy", lg=_set(sl, (0, 1), math.inf), sampling=(0.0, 0, 1.0, 0.0))
    processed("all_masked_row_filters", lg=_set(sl, (1,), -math.inf), sampling=(0.8, 3, 0.9, 0.05))
    processed("ok", sampling=(0.8, 3, 0.9, 0.05))
    processed("ok_empty_batch", lg=sl[:0])
    return out


def device_cases(device: str) -> list[tuple[str, Callable[[Any], Any]]]:
    """Mixed-device mistakes (the inputs on `device`, one argument on the CPU)."""
    x = _inputs(device)
    cpu = _inputs("cpu")
    p, q, tok, num, u, seed, off = x["probs"], x["draft_probs"], x["tokens"], x["num"], x["u"], x["seed"], x["offset"]
    return [
        ("draft_on_cpu", lambda ops: ops.verify_probs(p, cpu["draft_probs"], tok, num, u, "token", [])),
        ("tokens_on_cpu", lambda ops: ops.verify_probs(p, q, cpu["tokens"], num, u, "token", [])),
        ("num_on_cpu", lambda ops: ops.verify_logits(x["logits"], x["draft_logits"], tok, cpu["num"], u,
                                                     *PLAIN, "block", [])),
        ("uniforms_on_cpu", lambda ops: ops.verify_probs(p, q, tok, num, cpu["u"], "token", [])),
        ("seed_on_cpu", lambda ops: ops.verify_probs_philox(p, q, tok, num, cpu["seed"], off, "token", [])),
        ("sample_uniforms_on_cpu", lambda ops: ops.sample_logits(x["sample_logits"], cpu["sample_u"], *PLAIN)),
        ("sample_offset_on_cpu", lambda ops: ops.sample_logits_philox(x["sample_logits"], seed, cpu["offset"], *PLAIN)),
        ("tree_parents_on_cpu", lambda ops: ops.verify_tree(x["tree_target"], x["tree_draft"], x["tree_tokens"],
                                                            cpu["parents"], x["num_nodes"], x["tree_u"], *PLAIN,
                                                            "specinfer", [])),
        ("tree_uniforms_on_cpu", lambda ops: ops.verify_tree(x["tree_target"], None, x["tree_tokens"], x["parents"],
                                                             x["num_nodes"], cpu["tree_u"], *PLAIN, "greedy", [])),
        ("tree_draft_on_cpu", lambda ops: ops.verify_tree(x["tree_target"], cpu["tree_draft"], x["tree_tokens"],
                                                          x["parents"], x["num_nodes"], x["tree_u"], *PLAIN, "rrs", [])),
        ("tree_seed_on_cpu", lambda ops: ops.verify_tree_philox(x["tree_target"], x["tree_draft"], x["tree_tokens"],
                                                                x["parents"], x["num_nodes"], cpu["seed"], off, *PLAIN,
                                                                "rrs", [])),
    ]


def outcome(call: Callable[[Any], Any], ops: Any) -> list[str | None]:
    try:
        call(ops)
    except (ValueError, TypeError, RuntimeError, IndexError) as exc:
        lines = str(exc).splitlines()
        return [type(exc).__name__, lines[0] if lines else ""]
    return [None, None]


def run_cases(device: str, ops: Any = None, which: str = "cases") -> dict[str, list[str | None]]:
    if ops is None:
        import specdecode  # noqa: F401  (registers the ops)

        ops = torch.ops.specdecode
    chosen = cases(device) if which == "cases" else device_cases(device)
    return {name: outcome(call, ops) for name, call in chosen}


if __name__ == "__main__":
    print(json.dumps(run_cases(sys.argv[1], which=sys.argv[2] if len(sys.argv) > 2 else "cases")))
