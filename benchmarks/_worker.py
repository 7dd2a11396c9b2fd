"""One measurement in a fresh interpreter (run by the benchmark scripts, not by hand).

    python benchmarks/_worker.py '{"model": "chain", "method": "process", ...}'

method:
  process        the plain, untracked step; RSS from /proc/self/statm before the model is
                 built, its peak RSS (VmHWM) after the step (MEASURING.md).  Run it with
                 MALLOC_MMAP_THRESHOLD_=65536 MKL_DISABLE_FAST_MM=1.
  remat          remat.profile(mode="real") of the same step (and this process's own RSS peak).
  memtracker     torch.distributed._tools.mem_tracker.MemTracker around the plain step.
  fake           remat.profile(mode="fake").
Prints one line `RESULT {json}`.
"""

from __future__ import annotations

import gc
import json
import os
import resource
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

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _models import build, input_tensors, make_optimizer, plain_step  # noqa: E402

PAGE = os.sysconf("SC_PAGE_SIZE")


def rss_now() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * PAGE


def rss_peak() -> int:
    """Peak RSS of this process's own address space: VmHWM.  Not `ru_maxrss`, which Linux carries
    over from the parent's address space across fork + exec (harmless here only while the parent
    is smaller than this worker at its start, as the benchmark parents are)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024  # kB
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # no /proc: KiB on Linux


def main(spec: dict) -> dict:
    torch.set_num_threads(int(spec.get("threads", 2)))
    method = spec["method"]
    gc.collect()
    base = rss_now()
    model, inputs, loss_fn = build(spec["model"], spec.get("kwargs"), spec.get("segments", 0), spec.get("reentrant", False))
    opt = make_optimizer(spec.get("optimizer", "adam"), model)
    built = rss_now()
    res: dict = {"spec": spec, "base_rss": base, "build_rss": built - base}
    t0 = time.perf_counter()
    if method == "process":
        plain_step(model, inputs, loss_fn, opt)
    elif method in ("remat", "fake"):
        prof = remat.profile(model, inputs, loss_fn=loss_fn, optimizer=opt, mode="fake" if method == "fake" else "real")
        res.update(
            peak=prof.peak_bytes,
            peak_phase=prof.peak_phase,
            peak_op=prof.peak_op,
            peak_module=prof.peak_module,
            at_peak=prof.at_peak.as_dict(),
            recompute_flops=prof.recompute_flops,
            step_s=prof.step_s,
        )
    elif method == "memtracker":
        mt = MemTracker()
        mt.track_external(model, opt, *input_tensors(inputs))
        with mt:
            plain_step(model, inputs, loss_fn, opt)
        snap = mt.get_tracker_snapshot("peak")
        cpu = {str(getattr(k, "value", k)): v for d, s in snap.items() for k, v in s.items()} if snap else {}
        res.update(peak=int(cpu.get("Total", 0)), at_peak={k: int(v) for k, v in cpu.items() if k != "Total"})
    else:
        raise ValueError(method)
    res["seconds"] = time.perf_counter() - t0
    res["proc_peak"] = rss_peak() - base  # the process's own figure (for remat: includes its overhead)
    res["threads"] = torch.get_num_threads()
    return res


if __name__ == "__main__":
    out = main(json.loads(sys.argv[1]))
    print("RESULT " + json.dumps(out), flush=True)
