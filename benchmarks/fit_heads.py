"""`remat fit` across every model type transformers has for one head: which build and predict, which say why not.

usage:
  python benchmarks/fit_heads.py [--task multiple-choice] [--lora R]

For each model type of the task's `AutoModelFor...` mapping (transformers' own list, as installed): its config
class's defaults cut to one layer (`remat.fit.depth.with_layers`), `architectures` naming the task's class, then
`will_it_fit(config, "80GB", seq=64, batch=2)` (fake tensors, nothing downloaded).  A row says "ok" with the
verdict and the activations, or the error's first line: a `remat:` error is an answer (the model reads its batch's
values, say), anything else a defect.  Writes results/fit_heads_<task>.md/.json.
"""

from __future__ import annotations

import argparse
import sys
import time
import warnings
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
if (HERE.parent / "src").is_dir():
    sys.path.insert(0, str(HERE.parent / "src"))

import _common  # noqa: E402
from remat.fit import will_it_fit  # noqa: E402
from remat.fit.build import HEADS, _mapping, parse_task  # noqa: E402
from remat.fit.depth import with_layers  # noqa: E402


def survey(task: str, lora: int | None) -> list[list]:
    import transformers
    from transformers import CONFIG_MAPPING

    transformers.logging.set_verbosity_error()
    rows = []
    for kind, cls in sorted(_mapping(HEADS[parse_task(task)][1]).items()):
        t0 = time.perf_counter()
        try:
            config = CONFIG_MAPPING[kind]()
            try:
                config = with_layers(config, 1)
            except Exception:  # noqa: BLE001 -- a config whose depth fit cannot cut: its default depth
                pass
            config.architectures = [cls]
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                answer = will_it_fit(config, "80GB", seq=64, batch=2, lora=lora, changes=())
            said = f"ok: {answer.outcome.verdict}, activations {answer.profile.activation_bytes / 2**20:,.1f} MiB"
        except Exception as e:  # noqa: BLE001 -- every model type is a row
            first = str(e).splitlines()[0] if str(e) else ""
            said = f"{'remat: error' if first.startswith('remat:') else type(e).__name__}: {first[:200]}"
        rows.append([kind, cls, said, round(time.perf_counter() - t0, 1)])
        print(*rows[-1], sep=" | ", flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--task", default="multiple-choice", help="a remat fit --task (default: multiple-choice)")
    parser.add_argument("--lora", type=int, default=None, help="LoRA adapters of this rank")
    args = parser.parse_args()
    rows = survey(args.task, args.lora)
    ok = sum(r[2].startswith("ok") for r in rows)
    answered = sum(r[2].startswith("remat: error") for r in rows)
    summary = f"{ok} of {len(rows)} model types build and predict; {answered} get a remat: error"
    table = _common.md_table(["model type", "class", "remat fit", "s"], rows, pad=False)
    command = f"python benchmarks/fit_heads.py --task {args.task}" + (f" --lora {args.lora}" if args.lora else "")
    name = f"fit_heads_{args.task}" + (f"_lora{args.lora}" if args.lora else "")
    info = _common.machine_info()
    path = _common.write_results(name, f"remat fit --task {args.task}", info, command, [(summary, table)], rows)
    print(summary, f"wrote {path}", sep="\n")


if __name__ == "__main__":
    main()
