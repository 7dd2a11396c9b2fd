"""Issue 36's H200 peaks of 2026-12-04 against remat's predictions, less what earlier variants left allocated.

usage:
  python benchmarks/leak_account.py [--run RUN.json] [--predicted FAKE.json]

Until 2026-12-04 what `remat.apply` installed on a module held it strongly from the module's own `__dict__`: a
reference cycle, so a planned model that was dropped kept the modules remat had wrapped, their parameters included,
allocated until Python's cycle collector ran (NOTE [How a module is checkpointed in place], Rule 8, now fixed).
`gpu_seconds.py` ran its variants one after another in one process with no collection between them (it collects
now), so each variant's third-step `max_memory_allocated` also counted the parameters of every module an earlier
variant had planned.  For each variant of the run without torch.compile, in the order it ran, this takes the
parameter bytes of those modules off (every module `remat.apply` wraps for that variant, found by applying it to the
model on the meta device at the issue's size; Hugging Face's checkpointing makes no cycle), on the assumption that
no collection came in between, and prints measured, predicted (`peak_gap.py --fake-only`), held over and the rest.
Writes benchmarks/results/gpu_seconds/leak_account.md.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
if (HERE.parent / "src").is_dir():
    sys.path.insert(0, str(HERE.parent / "src"))

import remat  # noqa: E402
from _common import MiB, md_table  # noqa: E402
from gpu_seconds import PLANS, build  # noqa: E402
from remat.applier.wrapping import is_wrapped  # noqa: E402

RESULTS = HERE / "results"
RUN = RESULTS / "gpu_seconds" / "gpu_NVIDIA_H200_2026-12-04T1326.json"
PREDICTED = RESULTS / "peak_gap" / "cpu-fake-H100_2026-12-04T1743.json"
RAN = ("eager", "hf", "every-block", "plan65", "least")
"""The eager variants of RUN, in the order it ran them (its first tier)."""
PLANNED = ("every-block", "plan65", "least")
"""The variants that `remat.apply` plans (among RAN)."""


def wrapped_params(name: str, variant: str, plans: Path = PLANS) -> dict[str, int]:
    """{parameter name: bytes} of the modules `remat.apply` wraps for `variant` of `name`, at the issue's size."""
    model, _ = build(name, "issue", "meta")
    remat.apply(model, "every-block" if variant == "every-block" else remat.load_plan(plans / f"{name}.{variant}.json"))
    held = {
        id(p): (f"{m_name}.{p_name}", p.nbytes)
        for m_name, m in model.named_modules()
        if is_wrapped(m)
        for p_name, p in m.named_parameters()
    }
    return dict(held.values())


def account(run: dict, predicted: dict, plans: Path = PLANS) -> list[list]:
    """[model, variant, measured, predicted, replayed, held over] in bytes for each eager variant, in the order they
    ran: predicted is the fake step's peak of live tensors, replayed its caching allocator's `max_memory_allocated`
    (None in results from before 2026-12-04's second run)."""
    rows, held = [], {}
    for model, variant in [(m, v) for m in run["models"] for v in RAN]:
        measured = run["models"][model].get(variant, {}).get("peak_bytes")
        if measured is None:
            continue  # not run
        fake = predicted["steps"].get(f"{model} {variant}", {}).get("fake", {})
        if "peak_bytes" in fake:
            rows.append([model, variant, measured, fake["peak_bytes"], fake.get("allocated_bytes"), sum(held.values())])
        if variant in PLANNED:
            held.update({f"{model} {variant}:{k}": v for k, v in wrapped_params(model, variant, plans).items()})
    return rows


def render(rows: list[list]) -> str:
    """Each row in MiB, with what is left of the measured peak over each prediction once the held-over bytes are
    off, also as a share of the measured peak."""

    def rest(measured, said, over) -> str:
        return (
            "-"
            if said is None
            else f"{(measured - over - said) / MiB:,.1f} ({(measured - over - said) / measured:+.1%})"
        )

    headers = ["model", "variant", "measured", "predicted", "replayed", "held over", "rest", "rest (replayed)"]
    return md_table(
        headers,
        [
            [
                m,
                v,
                *(f"{b / MiB:,.1f}" if b is not None else "-" for b in (measured, said, replayed, over)),
                rest(measured, said, over),
                rest(measured, replayed, over),
            ]
            for m, v, measured, said, replayed, over in rows
        ],
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", type=Path, default=RUN, help="a gpu_seconds.py --gpu run's raw results")
    parser.add_argument("--predicted", type=Path, default=PREDICTED, help="peak_gap.py --fake-only's results")
    args = parser.parse_args()
    rows = account(json.loads(args.run.read_text()), json.loads(args.predicted.read_text()))
    text = render(rows)
    out = RESULTS / "gpu_seconds" / "leak_account.md"
    out.write_text(
        f"`python benchmarks/leak_account.py --run {args.run.name} --predicted {args.predicted.name}`\n\n{text}\n"
    )
    print(text, f"wrote {out}", sep="\n")


if __name__ == "__main__":
    main()
