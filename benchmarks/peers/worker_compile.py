"""Worker: torch.compile (Inductor) with `torch._functorch.config.activation_memory_budget` on
one model, in one fresh interpreter (run by run.py).

    run_fresh("peers/worker_compile.py:run", spec)   (benchmarks/_worker.py, under remat.verifier.process.PROCESS_ENV)

For each budget the whole step function (model + loss) is compiled afresh: a distinct code
object per budget (so Dynamo's cache never hands one budget's graph to another; no recompile limit), the FX graph
cache and the AOTAutograd cache off (so the partitioner really runs at each budget; Inductor's
on-disk kernel cache is left as found).  Figures per budget:
  compile_s      the first call (forward + backward) minus the median compiled step afterwards
  partition_s    seconds inside min_cut_rematerialization_partition (the knapsack: the planning)
  flops          FLOPs of the forward and backward graphs Inductor compiles (torch.utils.flop_counter
                 formulas over the nodes' shapes; FlopCounterMode cannot see inside compiled code)
  rss_peak       process peak of one step (heap trimmed, VmHWM reset before it), as the eager worker measures
  grads          against eager without checkpointing and against the compiled budget 1.0, seed 0
  time_ratio     median per-round ratio to eager without checkpointing, interleaved
With "remat_points" in the spec, remat + torch.compile is measured the same way (remat_compiled.py).
"""

from __future__ import annotations

import gc
import statistics
import sys
import time
import types
import warnings

import torch
import torch._functorch.config as functorch_config
import torch._inductor.compile_fx as compile_fx_mod
import torch._inductor.config as inductor_config
from torch._inductor.compile_fx import compile_fx, compile_fx_inner

from remat._torch_compat import flops_of  # the same formulas FlopCounterMode uses
from remat._torch_compat.compiler import compiled_as_compiled

from _common import timed  # noqa: E402
from measure import adam, compare_grads, flops_and_grads, grads_of, rss_step_peak, step, zero_grads  # noqa: E402
from _models import make_bench as build  # noqa: E402
import remat_compiled  # noqa: E402

warnings.filterwarnings("ignore")
inductor_config.fx_graph_cache = False
functorch_config.enable_autograd_cache = False

_partition_s = [0.0]
_original_partition = compile_fx_mod.min_cut_rematerialization_partition


def _timed_partition(*args, **kwargs):
    t0 = time.perf_counter()
    try:
        return _original_partition(*args, **kwargs)
    finally:
        _partition_s[0] += time.perf_counter() - t0


compile_fx_mod.min_cut_rematerialization_partition = _timed_partition


def log(*a):
    print(*a, file=sys.stderr, flush=True)


def graph_flops(gm: torch.fx.GraphModule) -> int:
    total = 0
    for n in gm.graph.nodes:
        if n.op == "call_function" and isinstance(n.target, torch._ops.OpOverload):
            args = torch.fx.node.map_arg(n.args, lambda a: a.meta.get("val"))
            kwargs = torch.fx.node.map_arg(n.kwargs, lambda a: a.meta.get("val"))
            try:
                total += flops_of(n.target, args, kwargs, n.meta.get("val"))
            except Exception:  # an op whose formula cannot take these arguments counts 0, like FlopCounterMode
                pass
    return total


def counting_backend(record: dict):
    def inner(gm, example_inputs, **kw):
        f = graph_flops(gm)
        record["bw_flops" if kw.get("is_backward") else "fw_flops"] += f
        record["graphs"] += 1
        return compile_fx_inner(gm, example_inputs, **kw)

    def backend(gm, example_inputs):
        return compile_fx(gm, example_inputs, inner_compile=inner)

    return backend


def fresh_function(fn, name: str):
    """A copy of `fn` with its own code object: Dynamo caches compiled graphs per code object."""
    code = fn.__code__.replace(co_name=name)
    return types.FunctionType(code, fn.__globals__, name, fn.__defaults__, fn.__closure__)


def warmed(spec: dict):
    """(bench, eager step): the spec's model built, torch set to its thread count, one warm-up step taken."""
    torch.set_num_threads(int(spec["threads"]))
    bench = build(spec["model"], spec["size"])

    def eager():
        return bench.loss(bench.call())

    step(bench, eager, adam(bench.model))  # warm-up
    zero_grads(bench.model)
    return bench, eager


# Every point compiles its own step, and each compilation adds one to the count of the code objects they share (the
# bench's `call`, the model's forward, transformers' `wrapper`): past Dynamo's recompile limit (8) those ran uncompiled,
# with a warning (seen 2026-11-28: the default GPT-2's ninth compiled point ran eager, 1.29x).  No limit, no silence.
@compiled_as_compiled()
def run(spec: dict) -> dict:
    t_start = time.perf_counter()
    bench, eager = warmed(spec)
    prof = None
    if spec.get("remat_points"):  # remat's profile before anything is compiled in this process
        prof, profile_s = remat_compiled.profile_first(bench)
    # Inductor's one-time start-up (imports, compile workers), so that it is not billed to the first budget
    t0 = time.perf_counter()
    w = torch.randn(8, 8, requires_grad=True)
    torch.compile(lambda x: (x.sin() * 2).sum())(w).backward()
    startup_s = time.perf_counter() - t0
    ref_flops, ref_grads = flops_and_grads(bench, eager)
    out = {
        "model": spec["model"],
        "none_flops": ref_flops,
        "eager_rss_peak": rss_step_peak(bench, eager),
        "inductor_startup_s": startup_s,
    }
    variants = {}
    for b in spec["budgets"]:
        record, call = compile_at(bench, eager, b, ref_grads)
        if call is not None:
            variants[b] = (bench, call)
        out.setdefault("budgets", []).append(record)
    ref_compiled = against_compiled(bench, out.get("budgets", []), {b: c for b, (_, c) in variants.items()})
    if prof is not None:
        out.update(remat_profile_s=profile_s, remat_tracker_peak=prof.peak_bytes)
        ours = remat_compiled.measure_points(
            bench, prof, out, spec, ref_grads, backend_for=counting_backend, fresh_function=fresh_function
        )
        variants.update(ours)
        against_compiled_remat(out.get("remat_compiled", []), ours, ref_compiled)
    for r in out.get("budgets", []) + out.get("remat_compiled", []):
        if "flops" in r:
            r["extra_flops"] = r["flops"] - ref_flops
    time_interleaved(bench, eager, variants, out, spec["rounds"])
    out["threads"] = torch.get_num_threads()
    out["elapsed_s"] = time.perf_counter() - t_start
    return out


def compile_at(bench, eager, b: float, ref_grads: dict):
    """The step compiled afresh at activation_memory_budget b: its figures, and the compiled call (None if it failed)."""
    record = {"budget": b, "fw_flops": 0, "bw_flops": 0, "graphs": 0}
    name = f"step_budget_{str(b).replace('.', '_')}"
    compiled = torch.compile(fresh_function(eager, name), backend=counting_backend(record))

    def call(compiled=compiled, b=b):
        with functorch_config.patch(activation_memory_budget=b):
            return compiled()

    _partition_s[0] = 0.0
    gc.collect()
    ok = None
    try:
        zero_grads(bench.model)
        t0 = time.perf_counter()
        call().backward()
        first = time.perf_counter() - t0
        zero_grads(bench.model)
        steady = statistics.median(timed(lambda: call().backward()) for _ in range(2))
        record.update(first_call_s=first, compile_s=max(0.0, first - steady), partition_s=_partition_s[0])
        record["flops"] = record["fw_flops"] + record["bw_flops"]
        record["grads_vs_eager"] = compare_grads(ref_grads, grads_of(bench, call))
        record["rss_peak"] = rss_step_peak(bench, call)
        ok = call
    except Exception as e:
        record["error"] = f"{type(e).__name__}: {str(e)[:300]}"
    zero_grads(bench.model)
    log(
        f"  compile budget {b}: {record.get('compile_s', 0):.1f} s (partition {record.get('partition_s', 0):.2f} s) "
        f"rss {record.get('rss_peak', 0) / 2**20:.1f} MiB, {record.get('flops', 0) / 1e9:.2f} GFLOP {record.get('error', '')}"
    )
    return record, ok


def against_compiled(bench, records: list[dict], variants: dict) -> dict | None:
    """FLOPs and gradients of each budget against the same step compiled at budget 1.0; its gradients (None where
    it did not compile)."""
    base = next((r for r in records if r["budget"] == 1.0 and "error" not in r), None)
    if base is None:
        return None
    ref_c = grads_of(bench, variants[1.0])
    for r in records:
        if "error" not in r:
            r["extra_flops_vs_compiled"] = r["flops"] - base["flops"]
            r["grads_vs_compiled_1"] = compare_grads(ref_c, grads_of(bench, variants[r["budget"]]))
    return ref_c


def against_compiled_remat(rows: list[dict], calls: dict, ref_compiled: dict | None) -> None:
    """Gradients of each remat + compile point against the step compiled at budget 1.0 from the same seed: the
    compiled step's own random numbers, which eager's differ from (dropout), so that a plan changing the gradients
    shows (torch.compile's budget did, pytorch/pytorch#190758)."""
    if ref_compiled is None:
        return
    by_key = {}  # one step per plan: a plan measured at several points has one set of gradients
    for r in rows:
        if "error" not in r and r.get("key") in calls:
            if r["key"] not in by_key:
                model_of, call = calls[r["key"]]
                by_key[r["key"]] = compare_grads(ref_compiled, grads_of(model_of, call))
            r["grads_vs_compiled_1"] = by_key[r["key"]]


def time_interleaved(bench, eager, variants: dict, out: dict, rounds: int) -> None:
    """Step times against eager without checkpointing, interleaved; round 0 is the warm-up.  `variants`:
    key -> (the Bench whose model it steps, the call); one Adam per model."""
    fns = {"eager": (bench, eager), **variants}
    opts = {}
    for b, _ in fns.values():
        opts.setdefault(id(b.model), adam(b.model))
    times = {k: [] for k in fns}
    for r in range(rounds + 1):
        for k, (b, fn) in fns.items():
            opt = opts[id(b.model)]
            t0 = time.perf_counter()
            step(b, fn, opt)
            dt = time.perf_counter() - t0
            opt.zero_grad(set_to_none=True)
            if r:
                times[k].append(dt)
    out["eager_step_s"] = statistics.median(times["eager"])
    keyed = [(rec["budget"], rec) for rec in out.get("budgets", [])]
    keyed += [(rec.get("key"), rec) for rec in out.get("remat_compiled", [])]
    for key, rec in keyed:
        if key in variants:
            ts = times[key]
            rec["step_s"] = statistics.median(ts)
            rec["time_ratios"] = [t / e for t, e in zip(ts, times["eager"])]
            rec["time_ratio"] = statistics.median(rec["time_ratios"])
            if 1.0 in variants:
                rec["time_ratio_vs_compiled"] = statistics.median(t / e for t, e in zip(ts, times[1.0]))
