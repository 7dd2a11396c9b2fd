"""The `remat` command: a thin layer over the library.

It parses arguments, loads the TARGET (`remat.target`), calls `remat.profile` and
`remat.plan` / `remat.frontier`, prints the reports of `remat.report` and writes the
files asked for.  Every `RematError` ends the command with its message on stderr and
exit status 2, without a traceback.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import re
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import torch
from rich.console import Console
from rich.status import Status

import remat
from remat.errors import InfeasibleBudget, RematError
from remat.planner.api import SOLVERS, baseline_plans
from remat.planner.budget import parse_budget
from remat.planner.dp import NotAChain
from remat.planner.plan import Plan
from remat.report.frontier_text import render_frontier
from remat.report.plan_text import render_plan
from remat.report.explain_text import render_explanation
from remat.report.plot import plot_frontier, plot_timeline
from remat.report.text import render_profile, summarize_profile
from remat.target import Target, load_target
from remat.types import StepProfile

EXIT_OK, EXIT_ERROR, EXIT_INTERRUPTED = 0, 2, 130
DEMO_TARGET = "remat.zoo:demo"
DEMO_BUDGET = 0.5  # of the demo step's unplanned peak
FRONTIER_MAX_POINTS = 256
SEQUENTIAL = "checkpoint_sequential("
TARGET_HELP = (
    "path/to/file.py:factory or package.module:factory; the factory returns (model, inputs) or (model, inputs, loss_fn)"
)


# -- optimizers the command line can name ---------------------------------------------------


def _adam(params) -> torch.optim.Optimizer:
    return torch.optim.Adam(params)


def _sgd(params) -> torch.optim.Optimizer:
    return torch.optim.SGD(params, lr=0.01)  # plain SGD: no optimizer state


OPTIMIZERS: dict[str, Callable | None] = {"adam": _adam, "sgd": _sgd, "none": None}


# -- entry point --------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    """Run the `remat` command line with `argv` (default: `sys.argv[1:]`); returns the exit status.

    Example:
        >>> main(["profile", "remat.zoo:mlp_report000", "--mode", "fake"])
        0

    Known limitations: argparse errors (unknown options) exit through `SystemExit(2)`
    as usual rather than returning.
    """
    args = build_parser().parse_args(argv)
    with _warnings_to_stderr():
        try:
            return args.command(args)
        except RematError as e:
            print(str(e), file=sys.stderr)
            return EXIT_ERROR
        except KeyboardInterrupt:
            print("remat: interrupted.", file=sys.stderr)
            return EXIT_INTERRUPTED


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the `remat` command, with one subparser per verb."""
    parser = argparse.ArgumentParser(
        prog="remat",
        description="Where the memory of one PyTorch training step goes, and how to checkpoint it.",
    )
    parser.add_argument("--version", action="version", version=f"remat {remat.__version__} (torch {torch.__version__})")
    verbs = parser.add_subparsers(title="commands", metavar="COMMAND", required=True)
    _add_profile(verbs)
    _add_plan(verbs)
    _add_explain(verbs)
    _add_demo(verbs)
    return parser


def _add_profile(verbs) -> None:
    p = verbs.add_parser(
        "profile",
        help="measure (or predict) the memory of one training step of TARGET",
        description="Profile one training step (forward, loss, backward, optimizer step) of TARGET.",
    )
    p.add_argument("target", metavar="TARGET", help=TARGET_HELP)
    _add_step_options(p)
    _add_outputs(p)
    p.add_argument("--top", type=_count_arg, default=10, metavar="N",
                   help="how many candidate blocks the report lists (default: 10)")
    p.set_defaults(command=_cmd_profile)


def _add_step_options(p: argparse.ArgumentParser) -> None:
    """How the step is run: shared by every verb that profiles a TARGET."""
    p.add_argument("--mode", choices=("real", "fake"), default="real",
                   help="real: run the step; fake: predict it with fake tensors, allocating nothing (default: real)")
    p.add_argument("--device", type=_device_arg, default=None,
                   help="device to profile for, e.g. cuda (default: where the factory puts the model); "
                   "with --mode fake a CUDA target is simulated on a machine without one")
    p.add_argument("--optimizer", choices=tuple(OPTIMIZERS), default="adam",
                   help="optimizer whose state counts in the step (default: adam; sgd has no state)")


def _add_plan(verbs) -> None:
    p = verbs.add_parser(
        "plan",
        help="find the checkpointing plan with the least recomputation that fits a memory budget",
        description="Profile one training step of TARGET (or read a profile saved with `remat profile --json`), "
        "find the activation-checkpointing plan with the least recomputation whose predicted peak fits "
        "--budget, and compare it with the hand recipes (checkpoint every block, Chen's sqrt(n), "
        "checkpoint_sequential) on the same step.",
    )
    p.add_argument("target", metavar="TARGET",
                   help=f"{TARGET_HELP}; or a profile JSON file written by `remat profile --json F`")
    p.add_argument("--budget", metavar="B", type=_budget_arg, default=None,
                   help='peak memory allowed for the whole step: "6GiB", "6GB", "800MiB", bytes (6442450944), '
                   "a fraction of the unplanned peak (0.5) or a percentage (50%%); "
                   "required unless --frontier or --plot")
    p.add_argument("--solver", choices=SOLVERS, default="auto",
                   help="auto (default): dp for a chain of blocks, else ilp; dp: optimal segmentation of a chain; "
                   "ilp: integer program over the whole module tree; chen: sqrt(n) segments (ignores the budget)")
    p.add_argument("--offload-bandwidth", metavar="R", default=None,
                   help='host<->GPU copy speed, e.g. "16GB/s" or "25GiB/s": lets the plan offload saved tensors to '
                   "CPU memory where the copies cost less than recomputing (CUDA steps only; a real CUDA profile "
                   "measures it itself)")
    p.add_argument("--device-flops", metavar="R", default=None,
                   help='the GPU\'s FLOP rate, e.g. "400TFLOPs/s", to weigh copies against recomputation in a '
                   "fake-mode profile (a real profile measures it)")
    _add_step_options(p)
    p.add_argument("--out", metavar="F", type=Path, help="also write the plan as JSON to F (remat.load_plan reads it)")
    p.add_argument("--frontier", action="store_true",
                   help="also print the frontier: every Pareto-optimal plan from keep-everything to the least memory")
    p.add_argument("--plot", metavar="F", type=Path,
                   help="write the frontier plot (peak MiB vs extra GFLOP, with the budget and the hand recipes) "
                   "as a PNG to F")
    p.add_argument("--verify", action="store_true",
                   help="apply the plan to the model and run the step with and without it: gradients, buffers, "
                   "extra FLOPs and measured peak against the prediction (needs a TARGET, real mode)")
    p.set_defaults(command=_cmd_plan)


def _add_demo(verbs) -> None:
    p = verbs.add_parser(
        "demo",
        help="profile, plan, apply and verify on a built-in GPT-2-style model",
        description=f"Profile one training step of the built-in {DEMO_TARGET} (a GPT-2-style model, Adam) "
        "and explain the result in plain words.",
    )
    _add_outputs(p)
    p.set_defaults(command=_cmd_demo)


def _add_outputs(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", metavar="F", type=Path, help="also write the profile as JSON to F")
    p.add_argument("--plot", metavar="F", type=Path, help="also write the memory timeline as a PNG to F")


def _device_arg(text: str) -> str:
    try:
        torch.device(text)
    except RuntimeError as e:
        raise argparse.ArgumentTypeError(f"not a torch device: {text!r} (e.g. cpu, cuda, cuda:1)") from e
    return text


def _budget_arg(text: str) -> int | float | str:
    """Bytes (int), a fraction (float, also from "50%"), or the text for `remat.plan` to read (units)."""
    t = text.strip()
    if re.fullmatch(r"[0-9]+", t):
        return int(t)
    if re.fullmatch(r"[0-9]*\.?[0-9]+%", t):
        return float(t[:-1]) / 100
    if re.fullmatch(r"[0-9]*\.[0-9]+", t):
        return float(t)
    return text


def _count_arg(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        n = -1
    if n < 0:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 0, saw {text!r}")
    return n


# -- remat profile ----------------------------------------------------------------------------


def _cmd_profile(args: argparse.Namespace) -> int:
    prof = _profile_target(args.target, args.mode, args.device, OPTIMIZERS[args.optimizer])
    print(render_profile(prof, top=args.top), end="")
    if args.json is not None or args.plot is not None:
        print()
    _write_outputs(prof, args.json, args.plot)
    return EXIT_OK


def _profile_target(target: str, mode: str, device: str | None, optimizer: Callable | None) -> StepProfile:
    return _profile_built(_load(target, mode, device), mode, device, optimizer)


def _load(target: str, mode: str, device: str | None) -> Target:
    with _spinner(f"loading {target}"):
        return load_target(target, fake=(mode == "fake"), device=_build_device(mode, device))


def _profile_built(built: Target, mode: str, device: str | None, optimizer: Callable | None) -> StepProfile:
    """`remat.profile` with a spinner on stderr saying which phase is running."""
    with _spinner("running the step") as status:
        return remat.profile(
            built.model, built.inputs, built.loss_fn,
            optimizer=optimizer, mode=mode, device=device, progress=_progress(status),
        )


def _build_device(mode: str, device: str | None) -> str | None:
    """Where the factory should build: `device`, except a CUDA target simulated in fake mode (CPU)."""
    if device is None or not device.startswith("cuda") or torch.cuda.is_available():
        return device
    if mode == "real":
        raise RematError(
            f"remat: --device {device} with --mode real runs the step on a GPU, but this machine has no "
            f"CUDA device (torch {torch.__version__}, torch.cuda.is_available() is False). "
            f"Fix: run on a machine with a GPU, or predict the step with --mode fake --device {device}."
        )
    return None


def _progress(status: Status) -> Callable[[str, int], None]:
    def report(phase: str, ops: int) -> None:
        status.update(f"running the step: {phase} ({ops} ops)")

    return report


@contextlib.contextmanager
def _spinner(text: str) -> Iterator[Status]:
    """A rich status spinner on stderr (shows nothing when stderr is not a terminal)."""
    with Console(stderr=True).status(text) as status:
        yield status


def _write_outputs(prof: StepProfile, json_path: Path | None, plot_path: Path | None) -> None:
    if json_path is not None:
        _write(json_path, "the profile as JSON", lambda p: p.write_text(prof.to_json(), encoding="utf-8"))
    if plot_path is not None:
        _write(plot_path, "the memory timeline plot", lambda p: plot_timeline(prof, p))


def _write(path: Path, what: str, write: Callable[[Path], None]) -> None:
    try:
        write(path)
    except OSError as e:
        raise RematError(
            f"remat: could not write {what} to {path}: {e.strerror or e}. Expected a writable file path. "
            "Fix: create the folder first, or pick another path."
        ) from e
    print(f"wrote {what} to {path}")


# -- remat plan -----------------------------------------------------------------------------------


def _offload_options(args: argparse.Namespace) -> dict:
    return {"offload_bandwidth": args.offload_bandwidth, "device_flops": args.device_flops}


def _cmd_plan(args: argparse.Namespace) -> int:
    _check_plan_args(args)
    built, prof = _plan_input(args)
    baselines = _baselines(prof)
    plan = None
    if args.budget is not None:
        with _spinner("planning"):
            plan = remat.plan(prof, args.budget, solver=args.solver, **_offload_options(args))
        print(render_plan(plan, baselines=report_baselines(baselines, plan.budget_bytes)), end="")
    if args.frontier or args.plot is not None:
        with _spinner("computing the frontier"):
            plans = pareto(remat.frontier(prof, solver=args.solver, max_points=FRONTIER_MAX_POINTS,
                                          **_offload_options(args)))
        budget_bytes = plan.budget_bytes if plan is not None else None
        if args.frontier:
            print("\n" if plan is not None else "", end="")
            print(render_frontier(plans, budget_bytes), end="")
        if args.plot is not None:
            _write(args.plot, "the frontier plot", lambda p: plot_frontier(plans, p, budget_bytes, baselines))
    if args.out is not None:
        _write(args.out, "the plan as JSON", plan.save)
    if args.verify:
        print()
        with _spinner("running the step with and without the plan"):
            report = remat.verify(built.model, built.inputs, plan, built.loss_fn, optimizer=OPTIMIZERS[args.optimizer])
        print(str(report), end="")
        return EXIT_OK if report.ok else EXIT_ERROR
    return EXIT_OK


def _check_plan_args(args: argparse.Namespace) -> None:
    """Errors in the arguments, found before the (possibly long) step runs."""
    if args.budget is None and not (args.frontier or args.plot is not None):
        raise RematError(
            "remat: `remat plan` needs a memory budget; none was given. "
            "Fix: add --budget 6GiB (or 0.5 of the unplanned peak), or --frontier to list every plan."
        )
    if args.budget is None and args.out is not None:
        raise RematError(
            f"remat: --out {args.out} writes the plan made for --budget, but no budget was given. "
            "Fix: add --budget B, or leave --out out."
        )
    if args.budget is not None:
        parse_budget(args.budget, 1)  # raises "remat: cannot read the budget ..." now rather than after the step
    if args.verify and (args.budget is None or args.mode != "real" or args.target.endswith(".json")):
        raise RematError(
            "remat: --verify runs the real step with and without the plan, so it needs --budget, --mode real "
            "and a TARGET (not a profile JSON file). Fix: drop --verify, or give those."
        )


def _plan_input(args: argparse.Namespace) -> tuple[Target | None, StepProfile]:
    """The profile to plan: read from a JSON file, or measured by running TARGET's step (with the target)."""
    if args.target.endswith(".json") and ":" not in args.target:
        return None, _read_profile(Path(args.target))
    built = _load(args.target, args.mode, args.device)
    return built, _profile_built(built, args.mode, args.device, OPTIMIZERS[args.optimizer])


def _read_profile(path: Path) -> StepProfile:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as e:
        raise RematError(
            f"remat: could not read the profile {str(path)!r}: {e.strerror or e}. Expected a JSON file written "
            "by `remat profile TARGET --json F`. Fix: check the path, or pass the TARGET itself."
        ) from e
    return StepProfile.from_json(text)


def _baselines(prof: StepProfile) -> dict[str, Plan]:
    """The hand recipes on the profile's main chain ({} when no block frees memory)."""
    try:
        return baseline_plans(prof)
    except NotAChain:
        return {}


def report_baselines(baselines: dict[str, Plan], budget_bytes: int | None) -> dict[str, Plan]:
    """Every block, Chen's sqrt(n), and the one checkpoint_sequential(k) a user would pick for the budget:
    the least recomputation among those that fit, else the one with the least memory."""
    chosen = {n: baselines[n] for n in ("every-block", "chen") if n in baselines}
    sequential = {n: p for n, p in baselines.items() if n.startswith(SEQUENTIAL)}
    fitting = [n for n, p in sequential.items() if budget_bytes is None or p.peak_bytes <= budget_bytes]
    if fitting:
        best = min(fitting, key=lambda n: (sequential[n].recompute_flops, sequential[n].peak_bytes))
    elif sequential:
        best = min(sequential, key=lambda n: (sequential[n].peak_bytes, sequential[n].recompute_flops))
    else:
        return chosen
    return {**chosen, best: sequential[best]}


def pareto(frontier: list[Plan]) -> list[Plan]:
    """`remat.frontier`'s first plan (keep everything, the reference), then the plans no other plan
    beats on both peak and extra FLOPs: a plan with the same FLOPs as another and a higher peak goes."""
    if not frontier:
        return []
    if any(p.offload for p in frontier):  # FLOPs alone do not rank offload plans: remat.frontier's own order
        return list(frontier)
    first, out = frontier[0], []
    for p in sorted(frontier[1:], key=lambda p: (p.recompute_flops, p.peak_bytes)):
        if p.peak_bytes < (out[-1] if out else first).peak_bytes:
            out.append(p)
    return [first, *out]


# -- remat explain ---------------------------------------------------------------------------------


def _add_explain(verbs) -> None:
    p = verbs.add_parser(
        "explain",
        help="why the model's own checkpointing does not lower memory, with measured bytes, and the fix",
        description="Run one training step of TARGET as written (recording every torch.utils.checkpoint call), "
        "again without its checkpoints, and once for each checkpoint remat cannot predict; print the findings "
        "(most serious first, by bytes at stake), the model's checkpoints, and the plan remat would use instead.",
    )
    p.add_argument("target", metavar="TARGET", help=TARGET_HELP)
    _add_step_options(p)
    p.add_argument("--observed", metavar="B", default=None,
                   help='a peak you measured yourself, e.g. "7212MiB" from nvidia-smi, to compare with the '
                   "tensors' peak remat measures")
    p.set_defaults(command=_cmd_explain)


def _cmd_explain(args: argparse.Namespace) -> int:
    built = _load(args.target, args.mode, args.device)
    with _spinner("running the step as written, then without its checkpoints"):
        expl = remat.explain(
            built.model, built.inputs, built.loss_fn, optimizer=OPTIMIZERS[args.optimizer],
            mode=args.mode, device=args.device, observed=args.observed,
        )
    print(render_explanation(expl), end="")
    return EXIT_OK


# -- remat demo ----------------------------------------------------------------------------------


@dataclass
class DemoRun:
    """What the demo's steps pass along: each step reads what earlier steps left here."""

    args: argparse.Namespace
    target: Target | None = None
    profile: StepProfile | None = None
    plan: Plan | None = None


def _demo_profile(run: DemoRun) -> None:
    run.target = _load(DEMO_TARGET, "real", None)
    run.profile = _profile_built(run.target, "real", None, _adam)
    print(render_profile(run.profile), end="")


def _demo_explain(run: DemoRun) -> None:
    print(summarize_profile(run.profile), end="")


def _demo_plan(run: DemoRun) -> None:
    """Plan the profiled step at DEMO_BUDGET of its peak (or at the least memory, if that is more)."""
    try:
        plan = remat.plan(run.profile, DEMO_BUDGET)
    except InfeasibleBudget as e:
        print(f"No plan reaches {DEMO_BUDGET:.0%} of the peak; planning for the least memory possible instead.")
        plan = remat.plan(run.profile, e.min_bytes)
    print(render_plan(plan, baselines=report_baselines(_baselines(run.profile), plan.budget_bytes)), end="")
    run.plan = plan


def _demo_verify(run: DemoRun) -> None:
    """Apply the plan and check it: same gradients and buffers, FLOPs and peak as predicted."""
    with _spinner("running the step with and without the plan"):
        report = remat.verify(run.target.model, run.target.inputs, run.plan, run.target.loss_fn, optimizer=_adam)
    print(str(report), end="")
    verdict = "nothing but memory and time changed" if report.ok else "the plan does NOT hold: see MISMATCH above"
    print(f"Verdict: {verdict}.")


def _demo_outputs(run: DemoRun) -> None:
    _write_outputs(run.profile, run.args.json, run.args.plot)


DemoStep = tuple[str, Callable[[DemoRun], None]]


def _demo_steps(args: argparse.Namespace) -> list[DemoStep]:
    """The demo, in order; later verbs (plan, apply, verify) add their steps here."""
    steps: list[DemoStep] = [
        (f"Profile one training step of {DEMO_TARGET} (GPT-2-style, Adam, real mode)", _demo_profile),
        ("In plain words", _demo_explain),
        (f"Plan checkpoints for a budget of {DEMO_BUDGET:.0%} of that peak", _demo_plan),
        ("Apply the plan and verify it against the unplanned step", _demo_verify),
    ]
    if args.json is not None or args.plot is not None:
        steps.append(("Write files", _demo_outputs))
    return steps


def _cmd_demo(args: argparse.Namespace) -> int:
    run, steps = DemoRun(args), _demo_steps(args)
    for i, (title, step) in enumerate(steps, start=1):
        if i > 1:
            print()
        print(f"[{i}/{len(steps)}] {title}")
        print()
        step(run)
    return EXIT_OK


# -- logging ------------------------------------------------------------------------------------


class _StderrHandler(logging.Handler):
    """Writes each record to whatever `sys.stderr` is at the time (so spinners and capture work)."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            print(self.format(record), file=sys.stderr)
        except Exception:  # logging must never break the command
            self.handleError(record)


@contextlib.contextmanager
def _warnings_to_stderr() -> Iterator[None]:
    """Show the library's warnings (fallbacks, approximations) on stderr while a command runs."""
    handler = _StderrHandler(logging.WARNING)
    handler.setFormatter(logging.Formatter("%(message)s"))
    logger = logging.getLogger("remat")
    logger.addHandler(handler)
    try:
        yield
    finally:
        logger.removeHandler(handler)
