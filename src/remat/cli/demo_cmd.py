"""`remat demo`: profile, plan, apply and verify on a built-in GPT-2-style model, step by step."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass

import remat
from remat.cli.common import EXIT_OK, adam, add_outputs, load, profile_built, progress_of, spinner, write_outputs
from remat.cli.plan_cmd import chain_baselines, report_baselines
from remat.errors import InfeasibleBudget
from remat.report.plan_text import render_plan, verdict
from remat.report.text import render_profile, summarize_profile
from remat.target import Target
from remat.types import Plan, StepProfile

DEMO_TARGET = "remat.zoo:demo"
DEMO_BUDGET = 0.6  # of the demo step's unplanned peak


def register(verbs) -> None:
    p = verbs.add_parser(
        "demo",
        help="profile, plan, apply and verify on a built-in GPT-2-style model",
        description=f"Profile one training step of the built-in {DEMO_TARGET} (a GPT-2-style model, Adam) "
        "and explain the result in plain words.",
    )
    add_outputs(p)
    p.set_defaults(command=_cmd_demo)


@dataclass
class DemoRun:
    """What the demo's steps pass along: each step reads what earlier steps left here."""

    args: argparse.Namespace
    target: Target | None = None
    profile: StepProfile | None = None
    plan: Plan | None = None

    def profiled(self) -> tuple[Target, StepProfile]:
        """The model and its profile, left by the profile step (which runs first)."""
        assert self.target is not None and self.profile is not None, "the demo profiles before anything else"
        return self.target, self.profile


def _demo_profile(run: DemoRun) -> None:
    run.target = load(DEMO_TARGET, "real", None)
    run.profile = profile_built(run.target, "real", None, adam)
    print(render_profile(run.profile), end="")


def _demo_explain(run: DemoRun) -> None:
    print(summarize_profile(run.profiled()[1]), end="")


def _demo_plan(run: DemoRun) -> None:
    """Plan the profiled step at DEMO_BUDGET of its peak (or at the least memory, if that is more)."""
    prof = run.profiled()[1]
    try:
        plan = remat.plan(prof, DEMO_BUDGET)
    except InfeasibleBudget as e:
        print(f"No plan reaches {DEMO_BUDGET:.0%} of the peak; planning for the least memory possible instead.")
        plan = remat.plan(prof, e.min_bytes)
    print(render_plan(plan, baselines=report_baselines(chain_baselines(prof), plan.budget_bytes)), end="")
    run.plan = plan


def _demo_verify(run: DemoRun) -> None:
    """Apply the plan and check it: same gradients and buffers, FLOPs and peak as predicted."""
    target = run.profiled()[0]
    assert run.plan is not None, "the demo plans before it verifies"
    with spinner("verify") as status:
        report = remat.verify(
            target.model,
            target.inputs,
            run.plan,
            target.loss_fn,
            optimizer=adam,
            progress=progress_of(status, "verify"),
        )
    print(str(report), end="")
    print(verdict(report))


def _demo_outputs(run: DemoRun) -> None:
    write_outputs(run.profiled()[1], run.args.json, run.args.plot)


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
