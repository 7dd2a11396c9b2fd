"""What the verbs share: the step options, the optimizers the command line can name,
loading and profiling the TARGET under a spinner, and writing the files asked for."""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import torch
from rich.console import Console
from rich.status import Status

import remat
from remat.errors import RematError
from remat.measure.device.roofline import NAMES
from remat.progress import PhaseLines
from remat.report.plot import plot_timeline
from remat.target import Target, load_target
from remat.types import StepProfile
from remat.types.kinds import Mode

EXIT_OK, EXIT_ERROR, EXIT_INTERRUPTED = 0, 2, 130
TARGET_HELP = (
    "path/to/file.py:factory or package.module:factory; the factory returns (model, inputs) or (model, inputs, loss_fn)"
)


# -- optimizers the command line can name ---------------------------------------------------


def adam(params) -> torch.optim.Optimizer:
    return torch.optim.Adam(params)


def sgd(params) -> torch.optim.Optimizer:
    return torch.optim.SGD(params, lr=0.01)  # plain SGD: no optimizer state


OPTIMIZERS: dict[str, Callable | None] = {"adam": adam, "sgd": sgd, "none": None}


# -- arguments ------------------------------------------------------------------------------


def add_step_options(p: argparse.ArgumentParser) -> None:
    """How the step is run: shared by every verb that profiles a TARGET."""
    p.add_argument(
        "--mode",
        choices=("real", "fake"),
        default="real",
        help="real: run the step; fake: predict it with fake tensors, allocating nothing (default: real)",
    )
    p.add_argument(
        "--device",
        type=_device_arg,
        default=None,
        help="device to profile for, e.g. cuda (default: where the factory puts the model); "
        "with --mode fake a CUDA target is simulated on a machine without one",
    )
    p.add_argument(
        "--optimizer",
        choices=tuple(OPTIMIZERS),
        default="adam",
        help="optimizer whose state counts in the step (default: adam; sgd has no state)",
    )
    p.add_argument(
        "--first-step",
        action="store_true",
        help="measure the first step of a new optimizer (default: the steady state, the step a "
        "training loop repeats, with the optimizer's state resident from its start)",
    )
    p.add_argument(
        "--loss-only",
        action="store_true",
        help="your loop keeps only the loss, letting the model's output go before backward, as Hugging "
        "Face's Trainer does (default: the output is kept until after backward, as in "
        "`out = model(**batch); out.loss.backward()`)",
    )
    p.add_argument(
        "--accumulate",
        type=int,
        default=1,
        metavar="K",
        help="forward/backward passes per optimizer step: gradient accumulation (default: 1)",
    )
    _add_rank_options(p)


def _add_rank_options(p: argparse.ArgumentParser) -> None:
    """The ranks and the device a fake-mode step is predicted for."""
    p.add_argument(
        "--world-size",
        type=int,
        default=1,
        metavar="N",
        help="with --mode fake, predict one rank of N data-parallel ranks; the TARGET's inputs are the "
        "global batch (default: 1, one process)",
    )
    p.add_argument(
        "--wrap",
        choices=("fsdp", "ddp"),
        default="fsdp",
        help="with --world-size: how the ranks share the model: fsdp (FSDP2's fully_shard on each "
        "block, then the model, as torchtitan does) or ddp (DistributedDataParallel) (default: fsdp)",
    )
    p.add_argument(
        "--hardware",
        choices=NAMES,
        default=None,
        type=_hardware_arg,
        help="with --mode fake, the device whose roofline predicts the seconds (default: this "
        "machine's GPU if it is one of these, else H100 for --device cuda, cpu otherwise)",
    )


def loop_options(args: argparse.Namespace) -> dict:
    """The `step`, `accumulate` and `keep_output` arguments of remat.profile and remat.verify, from the step
    options."""
    return {
        "step": "first" if args.first_step else "steady",
        "accumulate": args.accumulate,
        "keep_output": not args.loss_only,
    }


def profile_options(args: argparse.Namespace) -> dict:
    """`loop_options`, the ranks to predict (`world_size`, `wrap`) and the `hardware` of a prediction: the keyword
    arguments of remat.profile."""
    return {**loop_options(args), "world_size": args.world_size, "wrap": args.wrap, "hardware": args.hardware}


def add_outputs(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", metavar="F", type=Path, help="also write the profile as JSON to F")
    p.add_argument("--plot", metavar="F", type=Path, help="also write the memory timeline as a PNG to F")


def _hardware_arg(text: str) -> str:
    """Any case: "h100" is "H100"."""
    return next((n for n in NAMES if n.lower() == text.lower()), text)


def _device_arg(text: str) -> str:
    try:
        torch.device(text)
    except RuntimeError as e:
        raise argparse.ArgumentTypeError(f"not a torch device: {text!r} (e.g. cpu, cuda, cuda:1)") from e
    return text


# -- loading and profiling the TARGET ---------------------------------------------------------


def load(target: str, mode: str, device: str | None) -> Target:
    with spinner(f"loading {target}"):
        return load_target(target, fake=(mode == Mode.FAKE), device=_build_device(mode, device))


def profile_built(
    built: Target, mode: str, device: str | None, optimizer: Callable | None, loop: dict | None = None
) -> StepProfile:
    """`remat.profile` with a spinner on stderr saying which phase is running; `loop` from `profile_options`."""
    with spinner("running the step") as status:
        return remat.profile(
            built.model,
            built.inputs,
            built.loss_fn,
            optimizer=optimizer,
            mode=mode,
            device=device,
            progress=_progress(status),
            **(loop or {}),
        )


def _build_device(mode: str, device: str | None) -> str | None:
    """Where the factory should build: `device`, except a CUDA target simulated in fake mode (CPU)."""
    if device is None or not device.startswith("cuda") or torch.cuda.is_available():
        return device
    if mode == Mode.REAL:
        raise RematError(
            f"remat: --device {device} with --mode real runs the step on a GPU, but this machine has no "
            f"CUDA device (torch {torch.__version__}, torch.cuda.is_available() is False). "
            f"Fix: run on a machine with a GPU, or predict the step with --mode fake --device {device}."
        )
    return None


def _progress(status: "_Status | _Lines | _Silent") -> Callable[[str, int], None]:
    def report(phase: str, ops: int) -> None:
        status.update(f"running the step: {phase} ({ops} ops)", phase=phase)

    return report


def progress_of(status: "_Status | _Lines | _Silent", what: str) -> Callable[[str, int], None]:
    """A `progress=` callable for remat.verify (or any call) that shows its phases under `spinner`'s status."""
    return lambda phase, done: status.update(f"{what}: {phase}", phase=phase)


class _Lines:
    """`spinner` where stderr is no terminal (a pipe, a log): a line per phase, with the seconds since the start."""

    def __init__(self, text: str):
        self.lines = PhaseLines(text)
        print(f"remat: {text} ...", file=sys.stderr, flush=True)

    def update(self, text: str, phase: str | None = None) -> None:
        self.lines(phase or text)


class _Silent:
    def update(self, text: str, phase: str | None = None) -> None:
        pass


class _Status:
    """rich's spinner, its `update` taking the phase `_Lines` keys on."""

    def __init__(self, status: Status):
        self.status = status

    def update(self, text: str, phase: str | None = None) -> None:
        self.status.update(text)


PROGRESS_ENV = "REMAT_PROGRESS"
"""`off`: no progress on stderr at all; `lines`: a line per phase even in a terminal; else (`auto`, unset) a spinner
in a terminal and lines elsewhere."""


@contextlib.contextmanager
def spinner(text: str) -> Iterator["_Status | _Lines | _Silent"]:
    """What runs now, on stderr: a rich spinner in a terminal, else a line per phase (`remat: <text>: <phase>
    (<s> s)`), so a piped or logged command shows its progress too (PROGRESS_ENV says otherwise)."""
    console, setting = Console(stderr=True), os.environ.get(PROGRESS_ENV, "auto").lower()
    if setting == "off":
        yield _Silent()
        return
    if setting == "lines" or not console.is_terminal:
        lines = _Lines(text)
        yield lines
        lines.update("done")
        return
    with console.status(text) as status:
        yield _Status(status)


# -- writing files ----------------------------------------------------------------------------


def write_outputs(prof: StepProfile, json_path: Path | None, plot_path: Path | None) -> None:
    if json_path is not None:
        write(json_path, "the profile as JSON", lambda p: p.write_text(prof.to_json(), encoding="utf-8"))
    if plot_path is not None:
        write(plot_path, "the memory timeline plot", lambda p: plot_timeline(prof, p))


def write(path: Path, what: str, write_to: Callable[[Path], object]) -> None:
    """`write_to(path)`, then say so on stdout; an OSError becomes a RematError saying what could not be written."""
    try:
        write_to(path)
    except OSError as e:
        raise RematError(
            f"remat: could not write {what} to {path}: {e.strerror or e}. Expected a writable file path. "
            "Fix: create the folder first, or pick another path."
        ) from e
    print(f"wrote {what} to {path}")
