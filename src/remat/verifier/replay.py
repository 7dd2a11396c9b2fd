"""Whether the step without a plan replays itself from one seed, which `remat.verify`'s gradient check needs."""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator

import torch

# NOTE [A step that does not replay itself]
# verify runs the step without and with the plan from `torch.manual_seed(0)` and compares their gradients; that
# proves the plan only if the step without it gives the same gradients every time it runs from that seed.  Some
# do not: Hugging Face's Reformer calls `torch.seed()` (a seed from the OS) in every layer's forward when
# training, so two unplanned runs from one seed differ, and verify called its plan a MISMATCH although the plan
# did not change the step.
# Rule 1: where the planned step's gradients differ (on CUDA always, for the kernels' noise), the unplanned step
#         runs once more from the same seed.  It replayed the first run if all its gradients together (one vector)
#         moved by at most KERNEL_NOISE_AT_MOST of their norm.  Rounding in non-deterministic kernels moves them by
#         far less (H200: 1.7e-8 to 1.0e-7 at most in any element, GRAD_NOISE_FACTOR; a bfloat16 gradient's last
#         bit is 0.4% of it), random numbers drawn differently by a large share (2026-11-29, CPU: a 4-layer
#         Reformer's two runs about 0.23 of the norm; BERT's and GPT-2's dropout from two seeds 0.39 and 0.68).  The
#         norm of all of them, not each parameter's: a parameter whose gradients are all tiny can move by a large
#         share of them in rounding alone.  A reseed that changes no draw (Reformer with dropout 0 and a fixed
#         `hash_seed`) replays.
# Rule 2: a step that did not replay itself leaves the gradients unjudged: `report.ok` is False, the tolerance is
#         not widened by its difference, and the report says why and how to make the step replay (fixed seeds,
#         dropout 0) -- never "the plan changed the gradients", which nobody measured.
# Rule 3: on CPU a step that replayed itself can still differ from run to run now and then: the backward of an
#         index with repeated indices (`index_put_` accumulating, gpt-oss's expert biases gathered per token) adds
#         into each element from several threads at once, in the order they reach it.  On 2 cores, 2026-12-08
#         (`python benchmarks/cpu_nondeterminism.py`): `B[ids]`, 128 ids into 4 rows, gave 2,999 of 2,999 backwards
#         other gradients than its first, none under `torch.use_deterministic_algorithms(True)`; a 3-layer gpt-oss's
#         step 1 of 29 idle, 29 of 29 beside a second process spinning.  A second unplanned run can then agree
#         with the first by chance while the planned one did not: that gpt-oss's least plan, verified 12 times idle
#         and 12 beside the spinning process, was a MISMATCH in 3 and 1 at 9fda7f8 (the same script, that commit's
#         src first on PYTHONPATH); since, ok in all 24, one judged again (its first runs 4.7e-10 apart).  So on CPU,
#         where the gradients with the plan are not judged equal and the step replayed itself, both steps run once
#         more with torch's deterministic kernels (`deterministic_kernels`), and those two runs judge the plan
#         (`VerifyReport.grad_deterministic_diff`): the plan's recomputation runs the same kernels as the forward,
#         so a plan that changes the gradients changes them there too.  Not on CUDA, whose cuBLAS takes its
#         deterministic setting from the environment before its first call (Rule 1 judges it).

KERNEL_NOISE_AT_MOST = 1e-2


@contextlib.contextmanager
def deterministic_kernels() -> Iterator[None]:
    """Rule 3: torch's deterministic kernels for the runs inside, its setting put back after.  An op with none runs
    its usual kernel (`warn_only`) without torch's warning that it has none (the user did not ask for them)."""
    was, warn_only = torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()
    torch.use_deterministic_algorithms(True, warn_only=True)
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*does not have a deterministic implementation")
            yield
    finally:
        torch.use_deterministic_algorithms(was, warn_only=warn_only)


def replayed(first: dict[str, torch.Tensor], again: dict[str, torch.Tensor]) -> bool:
    """Rule 1: the gradients of a second run of the unplanned step, `again`, within KERNEL_NOISE_AT_MOST of the
    first run's norm, all parameters together."""
    both = [n for n in first if n in again]
    return _norm(again[n] - first[n] for n in both) <= KERNEL_NOISE_AT_MOST * _norm(first[n] for n in both)


def _norm(tensors) -> float:
    """The L2 norm of all of `tensors` together, as one vector."""
    return sum(t.double().pow(2).sum().item() for t in tensors) ** 0.5


def max_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    """The largest |a - b| over the parameters both have."""
    return max(((b[n] - g).abs().max().item() for n, g in a.items() if n in b and g.numel()), default=0.0)
