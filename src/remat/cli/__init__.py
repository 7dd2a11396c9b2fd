"""The `remat` command: a thin layer over the library.

It parses arguments, loads the TARGET (`remat.target`), calls `remat.profile` and
`remat.plan` / `remat.frontier`, prints the reports of `remat.report` and writes the
files asked for.  Every `RematError` ends the command with its message on stderr and
exit status 2, without a traceback.

One module per verb (`profile_cmd`, `plan_cmd`, `explain_cmd`, `fit_cmd`, `demo_cmd`), each with
its `register(verbs)` adding its subparser; `common` holds what they share.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import re
import sys
from collections.abc import Iterator

import torch

import remat
from remat.cli import demo_cmd, explain_cmd, fit_cmd, plan_cmd, profile_cmd
from remat.cli.common import EXIT_ERROR, EXIT_INTERRUPTED
from remat.cli.plan_cmd import pareto, report_baselines
from remat.errors import RematError

__all__ = ["build_parser", "main", "pareto", "report_baselines"]


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
            print(in_cli_words(str(e)), file=sys.stderr)
            return EXIT_ERROR
        except KeyboardInterrupt:
            print("remat: interrupted.", file=sys.stderr)
            return EXIT_INTERRUPTED


_KEYWORD = re.compile(
    r"\b(budget|offload_bandwidth|device_flops|max_segment|solver|mode|device|world_size|hardware)="
    r"(['\"]?)([^'\"\s,;)]+)\2"
)


def in_cli_words(message: str) -> str:
    """A library error's message as the command line says it: the keyword arguments its fixes name (`budget="6GiB"`,
    `max_segment=1`, `mode='fake'`) written as the flags that set them (`--budget 6GiB`, `--max-segment 1`)."""
    return _KEYWORD.sub(lambda m: f"--{m.group(1).replace('_', '-')} {m.group(3)}", message)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the `remat` command, with one subparser per verb."""
    parser = argparse.ArgumentParser(
        prog="remat",
        description="Where the memory of one PyTorch training step goes, and how to checkpoint it.",
    )
    parser.add_argument("--version", action="version", version=f"remat {remat.__version__} (torch {torch.__version__})")
    verbs = parser.add_subparsers(title="commands", metavar="COMMAND", required=True)
    for verb in (profile_cmd, plan_cmd, explain_cmd, demo_cmd, fit_cmd):
        verb.register(verbs)
    return parser


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
