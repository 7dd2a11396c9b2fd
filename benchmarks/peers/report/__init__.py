"""The peers report: tables, verdicts and plots rendered from run.py's data (the results JSON).

`render(data, img_prefix)` and `benchmarks_span(data)` are pure (data -> markdown); `write_all`
writes them, the plots and the slimmed JSON."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

from .document import BENCH_BEGIN, BENCH_END, benchmarks_span, model_names, render
from .plots import plot_model

HERE = Path(__file__).resolve().parent.parent
RESULTS = HERE.parent / "results"
DOCS = HERE.parent.parent / "docs"

__all__ = ["benchmarks_span", "render", "slim", "write_all", "write_benchmarks_span"]


def slim(data: dict) -> dict:
    """The data as the results JSON keeps it: without the plans themselves (each config keeps its key)."""
    out = json.loads(json.dumps(data))
    for R in out["models"].values():
        for c in R["eager"].get("configs", []) + (R["eager"].get("recheck") or {}).get("configs", []):
            c["spec"].pop("plan", None)
    return out


def write_all(data: dict, *, name: str, docs: bool, results_dir: Path = RESULTS, docs_dir: Path = DOCS) -> Path:
    """results/<name>.md and .json; with `docs`, docs/peers.md, docs/peers_<model>.png and the span in
    docs/benchmarks.md (a "large" run: docs/peers_large.md and docs/peers_large_<model>.png, no span);
    else the plots go to a temporary folder."""
    results_dir.mkdir(parents=True, exist_ok=True)
    plot_dir = docs_dir if docs else Path(tempfile.mkdtemp(prefix="peers-plots-"))
    stem = "peers_large" if data["profile"]["size"] == "large" else "peers"
    for m in model_names(data):
        R = data["models"][m]
        if not R["eager"].get("worker_error"):
            try:
                plot_model(m, R["eager"], R.get("compile"), plot_dir / f"{stem}_{m}.png")
            except Exception as e:  # a plot must not lose the tables
                print(f"plot {m} failed: {e}")
    (results_dir / f"{name}.json").write_text(json.dumps(slim(data), indent=1))  # first: a render error keeps it
    path = results_dir / f"{name}.md"
    path.write_text(render(data, "../../docs/" if docs else None))
    if docs:
        docs_dir.mkdir(exist_ok=True)
        (docs_dir / f"{stem}.md").write_text(render(data, ""))
        if stem == "peers":
            write_benchmarks_span(benchmarks_span(data), docs_dir / "benchmarks.md")
    else:
        print(f"plots in {plot_dir}")
    return path


def write_benchmarks_span(span: str, path: Path) -> None:
    """Replace the span between the markers in docs/benchmarks.md (insert it after the title if missing)."""
    text = path.read_text() if path.exists() else "# Benchmarks\n"
    if BENCH_BEGIN in text and BENCH_END in text:
        a, b = text.index(BENCH_BEGIN), text.index(BENCH_END) + len(BENCH_END)
        text = text[:a] + span + text[b:]
    else:
        lines = text.split("\n")
        i = next((k for k, ln in enumerate(lines) if ln.startswith("# ")), -1)
        lines[i + 1 : i + 1] = ["", span, ""]
        text = "\n".join(lines)
    path.write_text(text)
