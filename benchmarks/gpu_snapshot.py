"""What is live at a training step's CUDA peak, by the allocator's own trace (issue 34's follow-up).

    python benchmarks/gpu_snapshot.py --out F.json [--cases resmlp,resmlp:least,unet_bn,bert]
    python benchmarks/gpu_snapshot.py --out F.json --cases bert_base_mlm,bert_base_mlm:least   # issue 36's
    python benchmarks/gpu_snapshot.py --out F.json --cases bert_base_mlm+compile     # compiled, its code kept
    python benchmarks/gpu_snapshot.py --out F.json --kernels [--profiles] [--cases t5,bert]   # attention kernels

Each case runs in a fresh process: the gpu_check model built on the GPU, Adam, the plain loop of
`gpu_check.train_loop` (the output kept through backward), `torch.cuda.memory._record_memory_history` from
before the model is built, and after the third step the allocator's trace replayed: every block live when
the third step's allocated bytes were highest, its size and the Python frames that allocated it, grouped.
That list is what a fake-mode prediction is compared with, block by block, to find the bytes it misses.
A case ending in "+compile" is the model (with its plan) under `torch.compile`: its blocks are allocated by
Inductor's generated code, whose files are copied to `inductor_code/` beside F so the frames can be read here.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from collections import defaultdict
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import gpu_check  # noqa: E402  (its model builders, loop and import paths)
import torch  # noqa: E402

import remat  # noqa: E402
from remat._torch_compat.compiler import inductor_cache_dir  # noqa: E402
from _catalog import ISSUE36  # noqa: E402
from _common import MiB, run_fresh  # noqa: E402

PLANS = HERE / "results" / "gpu_seconds" / "plans"
"""Issue 36's plans, made for an H100 (`gpu_seconds.py --make-plans`)."""

STEPS = 3


def _frames(event: dict, keep: int = 5) -> str:
    """The innermost `keep` Python frames outside torch's own files, as 'file:line name' joined by ' < '."""
    out = []
    for f in event.get("frames", []):
        name = f.get("filename", "")
        if "/torch/" in name and "/nn/modules/" not in name and "utils/checkpoint" not in name:
            continue
        out.append(f"{Path(name).name}:{f.get('line')} {f.get('name')}")
        if len(out) == keep:
            break
    return " < ".join(out)


ATTENTION_OPS = (
    "_scaled_dot_product",
    "_efficient_attention",
    "_flash_attention",
    "_cudnn_attention",
    "_softmax",
    "bmm",
    "native_dropout",
    "baddbmm",
)


def _sdpa_call(args, kwargs) -> dict:
    """One `F.scaled_dot_product_attention` call: each argument's shape, dtype, strides and whether it needs a
    gradient; the kernel remat's simulation picks for it; on CUDA, torch's own verdict on flash and on the
    memory-efficient kernel with the reasons it warns (`can_use_*_attention(params, debug=True)`)."""
    import dataclasses
    import warnings

    from remat.measure.device.cuda_kernels import Attention, cuda_backend

    call = Attention(*args, **kwargs)  # torch's names and defaults
    a = {f.name: getattr(call, f.name) for f in dataclasses.fields(call)}

    def desc(t):
        if not isinstance(t, torch.Tensor):
            return None
        return {
            "shape": list(t.shape),
            "dtype": str(t.dtype),
            "stride": list(t.stride()),
            "requires_grad": t.requires_grad,
            "offset": t.storage_offset(),
        }

    row = {k: desc(a[k]) for k in ("query", "key", "value", "attn_mask")}
    row.update(
        dropout_p=a["dropout_p"],
        is_causal=a["is_causal"],
        enable_gqa=a["enable_gqa"],
        grad_enabled=torch.is_grad_enabled(),
        remat_predicts=cuda_backend(a["query"], a["key"], a["value"], a["attn_mask"], a["is_causal"], a["enable_gqa"]),
    )
    if a["query"].is_cuda:
        params = torch.backends.cuda.SDPAParams(
            a["query"], a["key"], a["value"], a["attn_mask"], a["dropout_p"], a["is_causal"], a["enable_gqa"]
        )
        for kernel, check in (
            ("flash", torch.backends.cuda.can_use_flash_attention),
            ("efficient", torch.backends.cuda.can_use_efficient_attention),
        ):
            with warnings.catch_warnings(record=True) as said:
                warnings.simplefilter("always")
                ok = check(params, True)
            row[kernel] = {"ok": ok, "why_not": [str(w.message)[:300] for w in said]}
    return row


def kernel_counts(case: str, size: str = "full") -> dict:
    """The attention-related aten ops one forward and backward of `case`'s model ran (which SDPA kernel CUDA
    picked: T5's self-attention runs the math path on CUDA, docs/validation.md section 6.1), by a dispatch mode
    that counts; each distinct `scaled_dot_product_attention` call's arguments and torch's reasons for its kernel (`_sdpa_call`)."""
    from collections import Counter

    import torch.nn.functional as F
    from torch.overrides import TorchFunctionMode
    from torch.utils._python_dispatch import TorchDispatchMode

    class Count(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.seen = Counter()

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            name = func.__name__
            if any(k in name for k in ATTENTION_OPS):
                self.seen[name] += 1
            return func(*args, **(kwargs or {}))

    calls: dict[str, dict] = {}

    class Calls(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            if func is F.scaled_dot_product_attention:
                row = _sdpa_call(args, kwargs)
                key = json.dumps({k: row[k] for k in ("query", "key", "attn_mask", "dropout_p")}, sort_keys=True)
                calls.setdefault(key, {**row, "calls": 0})["calls"] += 1
            return func(*args, **kwargs)

    device = "cuda" if torch.cuda.is_available() else "cpu"
    model, inputs, loss_fn = gpu_check.build(case, size, device)
    with Calls(), Count() as counter:
        gpu_check.loss_of(gpu_check.call(model, inputs), loss_fn).backward()
    return {
        "case": case,
        "device": torch.cuda.get_device_name() if device == "cuda" else "CPU",
        "torch": torch.__version__,
        "transformers": gpu_check._transformers_version(),
        "ops": dict(counter.seen.most_common()),
        "sdpa_calls": list(calls.values()),
    }


def profiles(case: str, size: str, out_dir: Path) -> dict:
    """`case`'s step profiled by remat in real mode on this machine's device and in fake mode for CUDA (an H100),
    each written whole (`StepProfile.to_json`) to `out_dir`, to be compared op by op on a machine without a GPU."""
    device = "cuda" if torch.cuda.is_available() else "cpu"
    found = {}
    for mode, where in (("real", {"device": device}), ("fake", {"device": "cuda", "hardware": "H100"})):
        model, inputs, loss_fn = gpu_check.build(
            case, size, device if mode == "real" else "cpu", autocast_device="cuda" if mode == "fake" else None
        )
        try:
            prof = remat.profile(
                model,
                inputs,
                loss_fn=loss_fn,
                optimizer=gpu_check.adam,
                mode=mode,
                **where,
                **gpu_check.profile_options(),
            )
        except Exception as e:  # one profile's failure is a result, the other still runs
            found[mode] = {"error": f"{type(e).__name__}: {e}"[:500]}
            continue
        path = out_dir / f"profile_{case}_{mode}.json"
        path.write_text(prof.to_json())
        found[mode] = {"file": path.name, "peak_bytes": prof.peak_bytes}
        del model, prof
        if device == "cuda":
            torch.cuda.empty_cache()
    return found


def live_at_peak(trace: list[dict], start: int = 0) -> dict:
    """Replays `trace` (one device's events, in order): the allocated bytes over time, and the blocks live when
    they were highest at or after event `start`.  An alloc adds its block; its free (free_completed, or
    free_requested if the trace has no completion) removes it."""
    live, cur, best, best_live, best_at = {}, 0, -1, {}, None
    for i, ev in enumerate(trace):
        action, addr = ev.get("action"), ev.get("addr")
        if action == "alloc":
            live[addr] = ev
            cur += ev["size"]
        elif action in ("free_completed", "free_requested") and addr in live:
            cur -= live.pop(addr)["size"]
        if i >= start and cur > best:
            best, best_live, best_at = cur, dict(live), i
    groups = defaultdict(lambda: [0, 0])
    for ev in best_live.values():
        g = groups[_frames(ev) or f"(no Python frame: autograd's thread) block of {ev['size']} B"]
        g[0] += ev["size"]
        g[1] += 1
    rows = sorted(({"bytes": b, "blocks": n, "frames": k} for k, (b, n) in groups.items()), key=lambda r: -r["bytes"])
    return {
        "peak_bytes": best,
        "event": best_at,
        "action_at_peak": trace[best_at].get("action") if best_at is not None else None,
        "frames_at_peak": _frames(trace[best_at], 8) if best_at is not None else "",
        "live": rows,
    }


def built(case: str, device: str = "cuda", size: str | None = None) -> tuple:
    """`(model, inputs, loss_fn)` of a case, "model", "model:kind" or either with "+compile", with that plan applied
    (then compiled): gpu_check's models at its full size with its plans, or issue 36's (`bert_base_mlm`,
    `llama_style_decoder`) at the issue's size with the plans `gpu_seconds.py --gpu` ran (docs/peers_gpu.md).
    `size` another size (the test's smoke)."""
    case, compiled = (case[: -len("+compile")], True) if case.endswith("+compile") else (case, False)
    name, _, kind = case.partition(":")
    if name in ISSUE36:
        model, inputs, loss_fn = gpu_check.build(name, size or "issue", device, "cuda" if device == "cuda" else None)
        plan = PLANS / f"{name}.{kind}.json"
    else:
        model, inputs, loss_fn = gpu_check.build(name, size or "full", device)
        made = json.loads((gpu_check.RESULTS / "made.json").read_text())
        plan = gpu_check.RESULTS / made["models"][name]["plans"][kind]["file"] if kind else None
    model = remat.apply(model, remat.load_plan(plan)) if kind else model
    return (torch.compile(model) if compiled else model), inputs, loss_fn


def generated_code(blocks: list[dict], dest: Path) -> list[str]:
    """Copies into `dest` each file that allocated one of `blocks` (trace events) and lies in Inductor's cache
    directory: the code it generated, which stays on the machine.  Returns the names copied, as `_frames` prints
    them."""
    cache = Path(inductor_cache_dir()).resolve()
    copied: dict[str, Path] = {}
    for ev in blocks:
        for f in ev.get("frames", []):
            path = Path(f.get("filename", "")).resolve()
            if path.name not in copied and path.is_file() and path.is_relative_to(cache):
                dest.mkdir(parents=True, exist_ok=True)
                copied[path.name] = Path(shutil.copyfile(path, dest / path.name))
    return sorted(copied)


def one_case(spec: dict) -> dict:
    """One model (and plan kind: `spec["case"]` is "model" or "model:kind", either compiled with "+compile") in this
    process, a fresh one (`run_fresh`): the loop of gpu_check, the trace read after the third step; of a compiled
    case, the code that allocated in the third step copied to `spec["code_dir"]` (`generated_code`)."""
    case = spec["case"]
    torch.cuda.memory._record_memory_history(max_entries=400_000, stacks="python")
    model, inputs, loss_fn = built(case)
    opt = gpu_check.adam(model.parameters())
    torch.manual_seed(1234)
    out = loss = None
    start = 0
    for i in range(STEPS):
        if i == STEPS - 1:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            start = len(torch.cuda.memory._snapshot()["device_traces"][0])
        out = gpu_check.call(model, inputs)
        loss = gpu_check.loss_of(out, loss_fn)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    torch.cuda.synchronize()
    snap = torch.cuda.memory._snapshot()
    trace = snap["device_traces"][0]
    res = live_at_peak(trace, start)
    res.update(
        case=case,
        max_memory_allocated=torch.cuda.max_memory_allocated(),
        max_memory_reserved=torch.cuda.max_memory_reserved(),
        events=len(trace),
        first_event=start,
        device=torch.cuda.get_device_name(),
        torch=torch.__version__,
    )
    if case.endswith("+compile"):
        res["code_files"] = generated_code(trace[start:], Path(spec["code_dir"]))
    return res


def _kernels(args: argparse.Namespace) -> None:
    """--kernels: each case's attention calls with torch's verdict on its fused kernels (and its profiles)."""
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    found = [kernel_counts(case, args.size) for case in args.cases.split(",")]
    if args.profiles:
        for r in found:
            r["profiles"] = profiles(r["case"], args.size, Path(args.out).parent)
    Path(args.out).write_text(json.dumps(found, indent=1))
    for r in found:
        print(r["case"], r["ops"], r.get("profiles"), flush=True)
        for c in r["sdpa_calls"]:
            mask = (c["attn_mask"] or {}).get("shape")
            fused = {k: c[k] for k in ("flash", "efficient") if k in c}
            print("   sdpa", c["calls"], "x", c["query"]["shape"], "mask", mask, "remat:", c["remat_predicts"], fused)


def _snapshots(args: argparse.Namespace) -> None:
    """Each case in a fresh process (`one_case`): what is live at the step's peak, by the allocator's trace."""
    results = []
    for case in args.cases.split(","):
        try:
            spec = {"case": case, "code_dir": str(Path(args.out).resolve().parent / "inductor_code")}
            results.append(run_fresh("gpu_snapshot.py:one_case", spec, timeout=300))
        except Exception as e:  # one case's failure is reported, the others still run
            results.append({"case": case, "error": f"{type(e).__name__}: {e}"})
        r = results[-1]
        print(case, {k: r.get(k) for k in ("peak_bytes", "max_memory_allocated", "error")}, flush=True)
        for row in r.get("live", [])[:12]:
            print(f"   {row['bytes'] / MiB:9.1f} MiB {row['blocks']:4d}  {row['frames'][:160]}")
    Path(args.out).write_text(json.dumps(results, indent=1))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--cases", default="resmlp,resmlp:least,unet_bn,bert")
    ap.add_argument("--kernels", action="store_true", help="count the attention kernels each case's step ran")
    ap.add_argument(
        "--profiles",
        action="store_true",
        help="with --kernels: each case's remat profile in real and in fake mode, written beside --out",
    )
    ap.add_argument("--size", default="full", help=argparse.SUPPRESS)
    args = ap.parse_args()
    (_kernels if args.kernels else _snapshots)(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
