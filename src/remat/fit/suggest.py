"""What to change when a step does not fit: one change at a time, the least that fits.

NOTE [What to change]
  Rule 1. Four kinds of change, and of each the least that fits: the batch halved (down to 1), the sequence
          halved (down to MIN_SEQ), LoRA adapters of rank LORA_RANK (where the model is fully trained), and the
          GPUs doubled (FSDP2, up to MAX_WORLD; each GPU keeps the batch).  The largest change is evaluated first;
          where it fits, a bisection finds the least (a smaller batch, a shorter sequence, more GPUs never need
          more memory): 1 + log2(n) evaluations of n candidates at most.
  Rule 2. A change no plan can make fit is not evaluated, by a bound on its least tensors.  With P, G, O the
          parameters, gradients and optimizer state of the step as asked (S = P + G + O) and L the least any plan
          of it reaches: all of S is live at the optimizer step, so L >= S; at L's peak P and O are live with at
          most G of gradients, so what else is live there (A) is at least L - S.  Batch and sequence leave S as it
          is, and A shrinks at most in proportion to the tokens (batch: f), or to their square (sequence: f^2,
          attention's scores where no fused kernel runs): the change reaches at least max(S, P + O + f A).  LoRA
          keeps P.  N GPUs keep 1/N of S each, and the same A (each computes the same batch): max(S/N, (P + O)/N
          + A).
  Rule 3. A change is evaluated by the whole model's step where it has fewer than EXTRAPOLATE_FROM layers (or is
          an encoder-decoder), else estimated from copies with 1 and 2
          (NOTE [A deep model from two shallow ones]): at 8 layers the two copies and a replay cost about as much
          as the whole step.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from remat.fit.estimate import estimate
from remat.fit.outcome import NO, Outcome, with_margin
from remat.fit.setup import FitError, Gpu, Setup
from remat.fit.step import judge, least_tensors, profile_step
from remat.report.text import fmt_bytes

KINDS = ("batch", "seq", "lora", "world-size")
MIN_SEQ = 128
MAX_WORLD = 8
LORA_RANK = 16
EXTRAPOLATE_FROM = 8


@dataclass(frozen=True)
class Suggestion:
    """One change tried (or ruled out by Rule 2), as the command line says it."""

    kind: str
    """"batch", "seq", "lora" or "world-size"."""
    change: str
    """The flag that makes the change: "--seq 4096"."""
    outcome: Outcome | None
    """None where there is nothing to change ("--batch" at 1)."""
    note: str = ""


def try_changes(
    config,
    head: str,
    main: Outcome,
    gpu: Gpu,
    layers: int | None,
    *,
    progress: Callable[[str], None] | None = None,
    kinds: tuple[str, ...] = KINDS,
) -> list[Suggestion]:
    """Rule 1: the changes of `kinds` tried for `main` (an outcome that does not fit), in order."""
    out: list[Suggestion] = []
    least = main.least_tensors_bytes or least_tensors(main.step_profile)
    for kind, candidates in _kinds(main.setup):
        if kind not in kinds:
            continue
        if not candidates:
            out.append(Suggestion(kind, f"--{kind}", None, _nothing_to_change(kind, main.setup)))
            continue
        open_ = []
        for change, setup, bound in candidates:
            floor = int(bound(main, least))
            if with_margin(floor) > gpu.memory_bytes:  # Rule 2
                why = f"needs at least {fmt_bytes(floor, 'auto')} of tensors, by a bound (docs/cli.md, remat fit)"
                out.append(Suggestion(kind, change, Outcome(setup, NO, least_bytes=floor, skipped=why)))
            else:
                open_.append((change, setup))

        def evaluate(change: str, setup: Setup) -> Outcome:
            if progress:
                progress(f"trying {change}")
            return _evaluate(config, head, setup, gpu, layers)

        out += [Suggestion(kind, change, outcome) for change, outcome in _search(open_, evaluate)]
    return out


def check_kinds(kinds: tuple[str, ...]) -> tuple[str, ...]:
    unknown = [k for k in kinds if k not in KINDS]
    if unknown:
        raise FitError(
            f"remat: the changes to try are some of {', '.join(KINDS)}, or none; saw "
            f"{', '.join(map(repr, unknown))}. Fix: e.g. --changes batch,seq (or --changes none)."
        )
    return tuple(kinds)


def _search(candidates: list[tuple[str, Setup]], evaluate) -> list[tuple[str, Outcome]]:
    """Rule 1's least change that fits among `candidates` (smallest change first; a larger one fits if a smaller
    does): the largest first, and where it fits, a bisection for the smallest.  What was evaluated, in order."""
    if not candidates:
        return []
    done = {len(candidates) - 1: evaluate(*candidates[-1])}
    lo, hi = 0, len(candidates) - 1
    if done[hi].fits:
        while lo < hi:
            mid = (lo + hi) // 2
            done[mid] = evaluate(*candidates[mid])
            lo, hi = (lo, mid) if done[mid].fits else (mid + 1, hi)
    return [(candidates[i][0], done[i]) for i in sorted(done)]


def _evaluate(config, head: str, setup: Setup, gpu: Gpu, layers: int | None) -> Outcome:
    """Rule 3."""
    if layers is not None and layers >= EXTRAPOLATE_FROM:
        return estimate(config, head, setup, gpu, layers)
    built, prof = profile_step(config, head, setup, gpu)
    return judge(built, prof, setup, gpu)


Bound = Callable[[Outcome, int], float]


def _kinds(setup: Setup) -> Iterator[tuple[str, list[tuple[str, Setup, Bound]]]]:
    """Rule 1's candidates, each with Rule 2's bound: (the outcome as asked, its least tensors) -> the least
    tensors the change can reach."""
    batches = _halvings(setup.batch, 1)
    yield "batch", [(f"--batch {b}", dataclasses.replace(setup, batch=b), _shrink(b / setup.batch, 1)) for b in batches]
    seqs = _halvings(setup.seq, MIN_SEQ)
    yield "seq", [(f"--seq {s}", dataclasses.replace(setup, seq=s), _shrink(s / setup.seq, 2)) for s in seqs]
    lora: list[tuple[str, Setup, Bound]] = []
    if not setup.lora:
        lora.append((f"--lora {LORA_RANK}", dataclasses.replace(setup, lora=LORA_RANK), _params))
    yield "lora", lora
    worlds, n = [], setup.world_size * 2
    while n <= MAX_WORLD:
        worlds.append((f"--world-size {n}", dataclasses.replace(setup, world_size=n), _shard(setup.world_size / n)))
        n *= 2
    yield "world-size", worlds


def _halvings(value: int, least: int) -> list[int]:
    out = []
    while value // 2 >= least:
        value //= 2
        out.append(value)
    return out


def _shrink(factor: float, power: int) -> Bound:
    def bound(main: Outcome, least: int) -> float:
        kept = main.step_profile.param_bytes + main.step_profile.optimizer_bytes
        return max(main.states_bytes, kept + factor**power * max(least - main.states_bytes, 0))

    return bound


def _shard(factor: float) -> Bound:
    def bound(main: Outcome, least: int) -> float:
        kept = main.step_profile.param_bytes + main.step_profile.optimizer_bytes
        return max(main.states_bytes * factor, kept * factor + max(least - main.states_bytes, 0))

    return bound


def _params(main: Outcome, least: int) -> float:
    return main.step_profile.param_bytes


def _nothing_to_change(kind: str, setup: Setup) -> str:
    if kind == "batch":
        return "already 1"
    if kind == "seq":
        return f"already {setup.seq} (no shorter than {MIN_SEQ} is tried)"
    if kind == "lora":
        return f"already --lora {setup.lora}"
    return f"already {setup.world_size} (more than {MAX_WORLD} is not tried)"
