"""`remat.profile` as users call it: the step profiled by `remat.measure`, and for a compiled model the compiled
step's own peak measured beside it.

NOTE [A compiled step's peak]
remat's tracker sees tensors through a dispatch mode, which cannot look inside the kernels Inductor generates,
so a compiled model is profiled eagerly (the model inside the compile wrapper, `remat.measure.profiling`).
The compiled step usually keeps less: Inductor fuses pointwise ops and does not store their outputs.  That
peak is measured here, once, by the counter `remat.verify` uses for the truth: the process's high-water mark
of a forked copy of this process running the training loop (third step; the copy compiles the step itself),
or `torch.cuda.max_memory_allocated` on CUDA.  It is stored in `StepProfile.compiled_peak_bytes`.

What the planner does with it (`remat.planner.api.plan`): a budget at or above the compiled step's measured
peak plus COMPILED_PEAK_MARGIN (2%: two measurements of one compiled step differed by up to 1.5%) needs no
checkpoint, whatever the eager step keeps, and gets the keep-everything plan with a note that says so.
`remat.verify` of a compiled model judges the budget on the compiled step's counter.  Below that budget,
plans are still made and priced on the eager step, which keeps more: they fit the compiled step with room
to spare (docs/compile.md), and may recompute more than it needs.

Known limitations: real mode and one process only (a fake-mode or N-rank prediction has no compiled figure);
on CPU it needs Linux (`/proc/self/clear_refs`) and `fork`; the forked copy compiles the step again, which
costs one compilation's time.
"""

from __future__ import annotations

import dataclasses
import functools

from remat._torch_compat.distributed import is_compiled
from remat.measure import profile as measure_profile
from remat.measure.loop import Loop
from remat.report.text import fmt_bytes
from remat.types import StepProfile
from remat.verifier.verify import independent_peak


@functools.wraps(measure_profile)
def profile(model, inputs, loss_fn=None, optimizer=None, mode: str = "real", **options) -> StepProfile:
    prof = measure_profile(model, inputs, loss_fn, optimizer, mode, **options)
    if mode != "real" or options.get("world_size", 1) != 1 or not is_compiled(model):
        return prof
    loop = Loop.of(options.get("step", "steady"), options.get("accumulate", 1))
    peak, counter = independent_peak(model, inputs, loss_fn, optimizer, loop)
    if peak is None:
        return prof
    note = (f"compiled step: {fmt_bytes(peak, 'auto')} by the {counter}, against {fmt_bytes(prof.peak_bytes, 'auto')} "
            "eager; a budget 2% above it or more needs no checkpoint (NOTE [A compiled step's peak]).")
    return dataclasses.replace(prof, compiled_peak_bytes=peak, compiled_counter=counter, notes=[*prof.notes, note])
