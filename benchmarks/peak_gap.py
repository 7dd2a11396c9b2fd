"""Issue 36's steps over their predicted peaks on a GPU: where the bytes the fake step misses are.

usage:
  python benchmarks/peak_gap.py [--models M,M] [--kinds eager,every-block,plan65,least] [--batch N] [--fake-only]
                                [--out F.json]

On the H200 (2026-12-04, docs/peers_gpu.md) the unplanned BERT-base step measured 12% over its fake-mode
prediction and its plans 21% and 33% over theirs, while on the CPU the same model's plans verify to the byte.  For
each model and kind this runs, on this machine's device (CUDA where there is one, else the CPU), the fake step
remat predicts for it (for an H100 on CUDA) and the real one, side by side:

- the unplanned step: `remat.profile` in fake mode and in real mode (the tracked peak, its op and phase, the bytes
  by kind at the peak) and the plain loop's third-step peak (`max_memory_allocated` on CUDA);
- a plan (`plan65`: at 65% of the fake peak, `least`: the least memory; at the issue's size and batch the ones
  `gpu_seconds.py --gpu` ran, else made from the fake profile as `gpu_seconds.py --make-plans` makes them): its
  predicted peak, `remat.verify`'s tracked and independent peaks (the CUDA allocator's on CUDA), and the real
  profile of the planned model (the op at the peak and its bytes).

A fake CUDA step also gives the caching allocator replayed on its allocations (NOTE [The caching allocator's
reserve]): the `max_memory_allocated` that counts the blocks handed out unsplit, and `max_memory_reserved`.

`every-block` is remat's recipe of every layer (the layers Hugging Face's gradient checkpointing takes).  `--batch
N` runs the models at the issue's widths with N rows (the CPU check of docs/peers_gpu.md: `--models bert_base_mlm
--kinds eager,least --batch 2`); `--smoke` at the tiny sizes (the test); `--fake-only` the predictions for the GPU
alone, no real step (on the laptop, at the issue's size).  Results are written after each step (a run the
device's time limit stops keeps them).
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
from datetime import datetime, timezone
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
if (ROOT / "src").is_dir():
    sys.path.insert(0, str(ROOT / "src"))

import remat  # noqa: E402
from _catalog import ISSUE36, SIZES  # noqa: E402
from _common import MiB, md_table  # noqa: E402
from gpu_seconds import PLANS, WARM, build, fake_profile, made_plans  # noqa: E402

KINDS = ("eager", "every-block", "plan65", "least")


def _kinds_of(prof) -> dict:
    """The bytes at a profile's peak by kind, in MiB."""
    return {k: round(v / MiB, 1) for k, v in prof.at_peak.as_dict().items() if k != "total_bytes" and v}


def _described(prof) -> dict:
    """The peak and where it is; for a CUDA step also the caching allocator replayed on its allocations
    (NOTE [The caching allocator's reserve]): `max_memory_allocated` with the blocks it hands out unsplit, and
    `max_memory_reserved`."""
    reserve = prof.gpu_reserve
    return {
        "peak_bytes": prof.peak_bytes,
        "allocated_bytes": reserve.allocated_bytes if reserve else None,
        "reserved_bytes": reserve.reserved_bytes if reserve else None,
        "op": prof.peak_op,
        "phase": str(prof.peak_phase),
        "module": prof.peak_module,
        "at_peak_mib": _kinds_of(prof),
    }


def plan_of(name: str, kind: str, size: str, device: str, committed: bool):
    """`kind`'s plan: `committed`, the one `gpu_seconds.py --gpu` ran (results/gpu_seconds/plans, made for the
    issue's size and batch), else made from the unplanned fake profile as `gpu_seconds.py --make-plans` makes them
    (`every-block`: remat's recipe of Hugging Face's every layer)."""
    if committed and kind != "every-block":
        return remat.load_plan(PLANS / f"{name}.{kind}.json")
    fake = fake_profile(name, size, device)
    if kind == "every-block":
        from remat.planner.recipes import baseline_plans

        return baseline_plans(fake)["every-block"]
    return made_plans(fake)[kind]


def loop_peak(model, batch: dict, device: str) -> int | None:
    """The plain loop's third-step peak (as gpu_seconds.py measures it); None on the CPU."""
    if device != "cuda":
        return None
    opt = torch.optim.AdamW(model.parameters())
    for i in range(WARM + 1):
        if i == WARM:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        result = model(**batch)
        result.loss.backward()  # the output held through backward, as gpu_seconds.py's loop
        opt.step()
        opt.zero_grad(set_to_none=True)
        del result
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated()


def one(name: str, kind: str, size: str, device: str, *, fake_only: bool = False, committed: bool = False) -> dict:
    """One model and kind: the fake prediction beside the real step (`fake_only`: the prediction alone);
    `committed`: with the plan the GPU run ran."""
    plan = None if kind == "eager" else plan_of(name, kind, size, device, committed)
    out: dict = {"fake": _described(fake_profile(name, size, device, plan)), "real": None, "loop_peak_bytes": None}
    if plan is not None:
        out["plan"] = {"predicted_peak_bytes": plan.peak_bytes, "checkpoints": len(plan.segments)}
    if fake_only:
        return out
    model, batch = build(name, size, device, autocast=device)
    if plan is not None:
        remat.apply(model, plan)
        rep = remat.verify(model, batch, plan, optimizer=torch.optim.AdamW(model.parameters()), time_rounds=1)
        out["verify"] = {
            "tracked_peak_bytes": rep.measured_peak_bytes,
            "independent_peak_bytes": rep.independent_peak_bytes,
            "independent_counter": str(rep.independent_counter),
            "grad_max_abs_diff": rep.grad_max_abs_diff,
        }
    real = remat.profile(model, batch, optimizer=torch.optim.AdamW(model.parameters()))
    out["real"] = _described(real)
    out["loop_peak_bytes"] = loop_peak(model, batch, device)
    return out


def rows_of(res: dict) -> list[list]:
    rows = []
    for key, r in res["steps"].items():
        if "error" in r:
            rows.append([key, r["error"][:80], "", "", "", "", ""])
            continue
        said = [
            r.get("plan", {}).get("predicted_peak_bytes"),
            r["fake"]["peak_bytes"],
            (r["real"] or {}).get("peak_bytes"),
        ]
        said += [r.get("verify", {}).get("independent_peak_bytes"), r["loop_peak_bytes"]]
        real = f"; real: {r['real']['op']} ({r['real']['phase']})" if r["real"] else ""
        where = f"fake: {r['fake']['op']} ({r['fake']['phase']}){real}"
        rows.append([key, *(f"{b / MiB:,.1f}" if b else "-" for b in said), where])
    return rows


def render(res: dict) -> str:
    head = [
        "step",
        "planned MiB",
        "fake profile MiB",
        "real profile MiB",
        "verify's counter MiB",
        "loop MiB",
        "peak op",
    ]
    return f"{res['device']}, torch {res['torch']}, {res['date']}\n\n" + md_table(head, rows_of(res), pad=False)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(ISSUE36), help="comma-separated, of " + ", ".join(ISSUE36))
    parser.add_argument("--kinds", default=",".join(KINDS), help="comma-separated, of " + ", ".join(KINDS))
    parser.add_argument("--batch", type=int, default=None, help="rows per step (default: the issue's)")
    parser.add_argument("--smoke", action="store_true", help="the tiny sizes (the test)")
    parser.add_argument("--fake-only", action="store_true", help="the predictions alone, no real step (for a GPU)")
    parser.add_argument("--out", type=Path, default=None, help="the results JSON (default: results/peak_gap/)")
    args = parser.parse_args()
    models, kinds = args.models.split(","), args.kinds.split(",")
    unknown = sorted(set(models) - set(ISSUE36)) + sorted(set(kinds) - set(KINDS))
    if unknown:
        sys.exit(f"remat: --models takes {list(ISSUE36)} and --kinds {list(KINDS)}; got {unknown}. Fix: name them.")
    size = "smoke" if args.smoke else "issue"
    if args.batch is not None:
        for name in models:
            SIZES[size][name]["batch"] = args.batch
    device = "cuda" if torch.cuda.is_available() or args.fake_only else "cpu"
    committed = size == "issue" and args.batch is None  # the plans the GPU ran were made for this size and batch
    stamp = datetime.now(timezone.utc)
    res = {
        "device": torch.cuda.get_device_name()
        if torch.cuda.is_available()
        else ("cpu-fake-H100" if args.fake_only else "cpu"),
        "torch": torch.__version__,
        "date": stamp.isoformat(timespec="seconds"),
        "size": size,
        "batch": {m: SIZES[size][m]["batch"] for m in models},
        "steps": {},
    }
    path = args.out or HERE / "results" / "peak_gap" / f"{res['device'].replace(' ', '_')}_{stamp:%Y-%m-%dT%H%M}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    for name in models:
        for kind in kinds:
            try:
                res["steps"][f"{name} {kind}"] = one(
                    name, kind, size, device, fake_only=args.fake_only, committed=committed
                )
            except Exception as e:  # noqa: BLE001 -- a step that fails is a result, the others still run
                res["steps"][f"{name} {kind}"] = {"error": f"{type(e).__name__}: {e}"[:300]}
            path.write_text(json.dumps(res, indent=1))
            gc.collect()  # the next step's peak counts nothing of this one (gpu_seconds.py's loop does the same)
            if device == "cuda":
                torch.cuda.empty_cache()
    print(render(res), f"wrote {path}", sep="\n")


if __name__ == "__main__":
    main()
