"""`remat plan TARGET --budget B`: the checkpointing plan with the least recomputation that fits,
compared with the hand recipes; also the frontier of every Pareto-optimal plan, and --verify."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import cast

import torch
import torch.nn as nn

import remat
from remat.cli.common import (
    EXIT_ERROR,
    EXIT_OK,
    OPTIMIZERS,
    TARGET_HELP,
    add_step_options,
    load,
    loop_options,
    progress_of,
    profile_options,
    profile_built,
    spinner,
    write,
)
from remat.compiled_plans import MORE_TRIALS, SEARCH_TRIALS, UNCOMPILED, plan_for
from remat.errors import InfeasibleBudget, RematError
from remat.gpu_fit import fit_gpu
from remat.planner import baseline_plans
from remat.planner.api import SOLVERS
from remat.planner.budget import parse_budget
from remat.planner.problem import MAX_SEGMENT, NotAChain
from remat.report.frontier_text import render_frontier
from remat.report.plan_text import render_plan, verdict
from remat.report.plot import plot_frontier
from remat.target import Target
from remat.types import Plan, StepProfile
from remat.types.kinds import Mode

FRONTIER_MAX_POINTS = 256
SEQUENTIAL = "checkpoint_sequential("


def register(verbs) -> None:
    p = verbs.add_parser(
        "plan",
        help="find the checkpointing plan with the least recomputation that fits a memory budget",
        description="Profile one training step of TARGET (or read a profile saved with `remat profile --json`), "
        "find the activation-checkpointing plan with the least recomputation whose predicted peak fits "
        "--budget, and compare it with the hand recipes (checkpoint every block, Chen's sqrt(n), "
        "checkpoint_sequential) on the same step.",
    )
    p.add_argument(
        "target", metavar="TARGET", help=f"{TARGET_HELP}; or a profile JSON file written by `remat profile --json F`"
    )
    p.add_argument(
        "--budget",
        metavar="B",
        default=None,
        help='peak memory allowed for the whole step: "6GiB", "6GB", "800MiB", bytes (6442450944), '
        "a fraction of the unplanned peak (0.5) or a percentage (50%%); "
        "required unless --frontier or --plot",
    )
    _add_solver_options(p)
    _add_compile_options(p)
    add_step_options(p)
    _add_plan_outputs(p)
    p.set_defaults(command=_cmd_plan)


def _add_compile_options(p: argparse.ArgumentParser) -> None:
    """`--compile`: the plan for the step torch.compile runs, chosen as `remat.auto` chooses it."""
    p.add_argument(
        "--compile",
        action="store_true",
        help="plan for the step as torch.compile(model) runs it: where the compiled step is over --budget, "
        "candidate plans (remat's checkpoints, torch.compile's own activation memory budget with dropout's "
        "masks kept, and both) are "
        "compiled and measured, and the fastest that fits is chosen, as remat.auto does (real mode; "
        "docs/compile.md). Apply the plan written by --out to torch.compile(model)",
    )
    p.add_argument(
        "--trials",
        metavar="N",
        type=int,
        default=SEARCH_TRIALS,
        help=f"with --compile: at most N candidates of each kind, one compilation each (default {SEARCH_TRIALS})",
    )


def _add_solver_options(p: argparse.ArgumentParser) -> None:
    """How the plan is searched: the solver, the longest run, and what offload is weighed with."""
    p.add_argument(
        "--solver",
        choices=SOLVERS,
        default="auto",
        help="auto (default): dp where the blocks run as one chain (a transformer's embeddings, layers, norm and "
        "head too), else ilp; dp: optimal segmentation of a chain, in milliseconds; ilp: integer program over the "
        "whole module tree (nested candidates), seconds to minutes; chen: sqrt(n) segments (ignores the budget)",
    )
    p.add_argument(
        "--max-segment",
        metavar="N",
        type=int,
        default=MAX_SEGMENT,
        help=f"the most consecutive modules one checkpoint may wrap (default {MAX_SEGMENT}); 1 wraps each module alone",
    )
    p.add_argument(
        "--offload-bandwidth",
        metavar="R",
        default=None,
        help='host<->GPU copy speed, e.g. "16GB/s" or "25GiB/s": lets the plan offload saved tensors to '
        "CPU memory where the copies cost less than recomputing (CUDA steps only; a real CUDA profile "
        "measures it itself)",
    )
    p.add_argument(
        "--device-flops",
        metavar="R",
        default=None,
        help='the GPU\'s FLOP rate, e.g. "400TFLOPs/s", to weigh copies against recomputation in a '
        "fake-mode profile (a real profile measures it)",
    )


def _add_plan_outputs(p: argparse.ArgumentParser) -> None:
    """What `remat plan` writes and checks besides the plan it prints."""
    p.add_argument("--out", metavar="F", type=Path, help="also write the plan as JSON to F (remat.load_plan reads it)")
    p.add_argument(
        "--frontier",
        action="store_true",
        help="also print the frontier: every Pareto-optimal plan from keep-everything to the least memory",
    )
    p.add_argument(
        "--plot",
        metavar="F",
        type=Path,
        help="write the frontier plot (peak MiB vs extra GFLOP, with the budget and the hand recipes) as a PNG to F",
    )
    p.add_argument(
        "--verify",
        action="store_true",
        help="apply the plan to the model and run the step with and without it: gradients, buffers, "
        "extra FLOPs and measured peak against the prediction (needs a TARGET, real mode)",
    )


def _solver_options(args: argparse.Namespace) -> dict:
    return {
        "offload_bandwidth": args.offload_bandwidth,
        "device_flops": args.device_flops,
        "max_segment": args.max_segment,
    }


def _cmd_plan(args: argparse.Namespace) -> int:
    _check_plan_args(args)
    built, prof = _plan_input(args)
    baselines = chain_baselines(prof)
    plan = None
    if args.budget is not None:
        plan = _plan_for_budget(args, built, prof)
        hand = {} if args.compile else report_baselines(baselines, plan.budget_bytes)  # eager: not comparable
        print(render_plan(plan, baselines=hand), end="")
    if args.frontier or args.plot is not None:
        with spinner("computing the frontier"):
            plans = remat.frontier(prof, solver=args.solver, max_points=FRONTIER_MAX_POINTS, **_solver_options(args))
        budget_bytes = plan.budget_bytes if plan is not None else None
        if args.frontier:  # every plan, and the one --budget chose marked
            print("\n" if plan is not None else "", end="")
            print(render_frontier(plans, budget_bytes, chosen=plan), end="")
        if args.plot is not None:  # peak against FLOPs: the plans no other beats on both
            write(args.plot, "the frontier plot", lambda p: plot_frontier(pareto(plans), p, budget_bytes, baselines))
    if args.out is not None:
        assert plan is not None, "_check_plan_args: --out needs --budget"
        write(args.out, "the plan as JSON", plan.save)
    if args.verify:
        assert plan is not None and built is not None, "_check_plan_args: --verify needs --budget and a real TARGET"
        print()
        with spinner("verify") as status:
            report = remat.verify(
                built.model,
                built.inputs,
                plan,
                built.loss_fn,
                optimizer=OPTIMIZERS[args.optimizer],
                **loop_options(args),
                target=args.target,
                progress=progress_of(status, "verify"),
            )
        print(str(report), end="")
        print(verdict(report))
        return EXIT_OK if report.ok else EXIT_ERROR
    return EXIT_OK


def _plan_for_budget(args: argparse.Namespace, built: Target | None, prof: StepProfile) -> Plan:
    """The plan `--budget` asks for: `remat.plan`'s, fitted to the GPU's reserve on a CUDA step, or with `--compile`
    the one chosen by measuring the compiled step."""
    plan = _compiled_plan(args, built, prof) if args.compile else None
    if plan is None:
        with spinner("planning"):
            plan = remat.plan(prof, args.budget, solver=args.solver, **_solver_options(args))
    # NOTE [A plan fits the GPU's reserve]; a plan measured on the compiled step was measured there already
    if built is not None and prof.gpu_reserve is not None and not plan.measured_peak_bytes:
        with spinner("replaying the planned step through the GPU's caching allocator"):
            plan = fit_gpu(
                built.model,
                (built.inputs, built.loss_fn, OPTIMIZERS[args.optimizer]),
                prof,
                plan,
                {"solver": args.solver, **_solver_options(args)},
                profile_options(args),
            )
    return plan


def _compiled_plan(args: argparse.Namespace, built: Target | None, prof: StepProfile) -> Plan | None:
    """`--compile`: NOTE [Plans for a compiled step], as `remat.auto` runs it, not applied; None where the compiled
    step was not measured (the plan is then remat.plan's)."""
    if built is None or not prof.compiled_peak_bytes:
        return None
    step = (built.inputs, built.loss_fn, OPTIMIZERS[args.optimizer])
    budget = parse_budget(args.budget, prof.peak_bytes)
    options = {"solver": args.solver, **_solver_options(args)}
    try:
        with spinner("compiling and measuring candidate plans") as status:  # each: "candidate 2 of at most 12: ..."
            told = progress_of(status, "compiling and measuring")
            return plan_for(built.model, step, prof, budget, args.trials, options, progress=told)
    except InfeasibleBudget as e:  # in the CLI's words
        raise InfeasibleBudget(
            str(e)
            .replace(MORE_TRIALS, "more candidates (--trials 8)")
            .replace(UNCOMPILED, "the same command without --compile"),
            e.min_bytes,
            budget,
        ) from None


def _check_plan_args(args: argparse.Namespace) -> None:
    """Errors in the arguments, found before the (possibly long) step runs."""
    if args.compile:
        _check_compile_args(args)
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
    if args.verify and (args.budget is None or args.mode != Mode.REAL or args.target.endswith(".json")):
        raise RematError(
            "remat: --verify runs the real step with and without the plan, so it needs --budget, --mode real "
            "and a TARGET (not a profile JSON file). Fix: drop --verify, or give those."
        )


def _check_compile_args(args: argparse.Namespace) -> None:
    """`--compile` measures the compiled step of the default loop, in real mode, for a budget."""
    clash = [
        flag
        for flag, given in (
            ("--mode fake", args.mode != Mode.REAL),
            ("--frontier", args.frontier),
            ("--plot", args.plot is not None),
            ("--first-step", args.first_step),
            ("--loss-only", args.loss_only),
            (f"--accumulate {args.accumulate}", args.accumulate != 1),
            (f"--world-size {args.world_size}", args.world_size != 1),
            ("a profile JSON file", _is_profile_file(args.target)),
        )
        if given
    ]
    if clash:
        raise RematError(
            f"remat: --compile compiles and measures candidate plans on the real steady step (the output kept "
            f"through backward, one pass per optimizer step), for --budget; seen with {', '.join(clash)}. "
            "Fix: drop those, or drop --compile to plan the eager step."
        )
    if args.budget is None:
        raise RematError(
            "remat: --compile chooses a plan for a memory budget; none was given. Fix: add --budget 6GiB "
            "(or 0.5 of the unplanned eager peak)."
        )
    if args.trials < 1:
        raise RematError(
            f"remat: --trials is how many candidate plans of each kind to compile, 1 or more; saw {args.trials}. "
            f"Fix: --trials {SEARCH_TRIALS} (the default) or more."
        )


def _plan_input(args: argparse.Namespace) -> tuple[Target | None, StepProfile]:
    """The profile to plan: read from a JSON file, or measured by running TARGET's step (with the target)."""
    if _is_profile_file(args.target):
        return None, _read_profile(Path(args.target))
    built = load(args.target, args.mode, args.device)
    if args.compile:  # the step torch.compile runs: its peak measured too (NOTE [Plans for a compiled step])
        built = built._replace(model=cast(nn.Module, torch.compile(built.model)))
    return built, profile_built(built, args.mode, args.device, OPTIMIZERS[args.optimizer], profile_options(args))


def _is_profile_file(target: str) -> bool:
    """TARGET names a profile saved by `remat profile --json F`, not a factory (`file.py:make`)."""
    return target.endswith(".json") and ":" not in target


def _read_profile(path: Path) -> StepProfile:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as e:
        raise RematError(
            f"remat: could not read the profile {str(path)!r}: {e.strerror or e}. Expected a JSON file written "
            "by `remat profile TARGET --json F`. Fix: check the path, or pass the TARGET itself."
        ) from e
    return StepProfile.from_json(text)


def chain_baselines(prof: StepProfile) -> dict[str, Plan]:
    """The hand recipes on the profile's main chain ({} when no block frees memory)."""
    try:
        return baseline_plans(prof)
    except NotAChain:
        return {}


def report_baselines(baselines: dict[str, Plan], budget_bytes: int | None) -> dict[str, Plan]:
    """Every block, Chen's sqrt(n), and the one checkpoint_sequential(k) a user would pick for the budget:
    the least recomputation among those that fit, else the one with the least memory."""
    chosen: dict[str, Plan] = {n: baselines[n] for n in ("every-block", "chen") if n in baselines}
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
    first, out = frontier[0], list[Plan]()
    for p in sorted(frontier[1:], key=lambda p: (p.recompute_flops, p.peak_bytes)):
        if p.peak_bytes < (out[-1] if out else first).peak_bytes:
            out.append(p)
    return [first, *out]
