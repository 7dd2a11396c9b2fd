"""One step of one benchmark model measured, in a fresh interpreter: `_common.run_fresh(STEP, spec)`.

The spec: `model`, `kwargs`, `segments`, `reentrant` (see `_models.build`), `how` (checkpoints
applied by hand, `_models.apply_by_hand`), `optimizer` (adam, sgd, none), `threads`, and

method:
  process        the plain, untracked step; RSS from /proc/self/statm before the model is
                 built, its peak RSS (VmHWM) after the step (MEASURING.md; the readers are
                 `remat.verifier.process`).  Run it with `remat.verifier.process.PROCESS_ENV`.
  remat          remat.profile(mode="real") of the same step (and this process's own RSS peak).
  memtracker     torch.distributed._tools.mem_tracker.MemTracker around the plain step.
  fake           remat.profile(mode="fake").
Returns the figures as a dict.
"""

from __future__ import annotations

import gc
import os
import sys
import time

# Everything imported before the baseline is read, so that module code is not counted.
import torch
import torch.utils.checkpoint  # noqa: F401

try:
    import transformers  # noqa: F401
    import transformers.models.bert.modeling_bert  # noqa: F401
    import transformers.models.gpt2.modeling_gpt2  # noqa: F401

    transformers.logging.set_verbosity_error()
except ImportError:  # pragma: no cover
    pass
from torch.distributed._tools.mem_tracker import MemTracker

import remat
from remat.verifier.process import high_water_mark_bytes, resident_bytes

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _models import apply_by_hand, build, input_tensors, make_optimizer, plain_step  # noqa: E402


def measure(spec: dict) -> dict:
    torch.set_num_threads(int(spec.get("threads", 2)))
    gc.collect()
    base = resident_bytes()
    model, inputs, loss_fn = build(
        spec["model"], spec.get("kwargs"), spec.get("segments", 0), spec.get("reentrant", False)
    )
    model = apply_by_hand(model, spec.get("how", {}))
    opt = make_optimizer(spec.get("optimizer", "adam"), model)
    built = resident_bytes()
    res: dict = {"spec": spec, "base_rss": base, "build_rss": built - base}
    t0 = time.perf_counter()
    res.update(METHODS[spec["method"]](spec["method"], model, inputs, loss_fn, opt))
    res["seconds"] = time.perf_counter() - t0
    res["proc_peak"] = high_water_mark_bytes() - base  # the process's own figure (for remat: includes its overhead)
    res["threads"] = torch.get_num_threads()
    return res


def _process(method, model, inputs, loss_fn, opt) -> dict:
    plain_step(model, inputs, loss_fn, opt)
    return {}


def _remat(method, model, inputs, loss_fn, opt) -> dict:
    prof = remat.profile(model, inputs, loss_fn=loss_fn, optimizer=opt, mode="fake" if method == "fake" else "real")
    return {
        "peak": prof.peak_bytes,
        "peak_phase": prof.peak_phase,
        "peak_op": prof.peak_op,
        "peak_module": prof.peak_module,
        "at_peak": prof.at_peak.as_dict(),
        "recompute_flops": prof.recompute_flops,
        "step_s": prof.step_s,
    }


def _memtracker(method, model, inputs, loss_fn, opt) -> dict:
    mt = MemTracker()
    mt.track_external(model, opt, *input_tensors(inputs))
    with mt:
        plain_step(model, inputs, loss_fn, opt)
    snap = mt.get_tracker_snapshot("peak")
    cpu = {str(getattr(k, "value", k)): v for d, s in snap.items() for k, v in s.items()} if snap else {}
    return {"peak": int(cpu.get("Total", 0)), "at_peak": {k: int(v) for k, v in cpu.items() if k != "Total"}}


METHODS = {"process": _process, "remat": _remat, "fake": _remat, "memtracker": _memtracker}
