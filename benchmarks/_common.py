"""Shared helpers for the benchmark scripts: machine description, tables, dated results,
fresh-process runs.  Nothing here is part of the `remat` package."""

from __future__ import annotations

import datetime as _dt
import json
import os
import platform
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
MiB = 2**20

# The environment MEASURING.md asks for when RSS must follow live tensors.
RSS_ENV = {"MALLOC_MMAP_THRESHOLD_": "65536", "MKL_DISABLE_FAST_MM": "1"}


def cpu_name() -> str:
    name = platform.processor()
    if name:
        return name
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.machine()


def machine_info(threads: int | None = None) -> dict:
    import torch

    try:
        import transformers

        tf = transformers.__version__
    except ImportError:  # pragma: no cover
        tf = "not installed"
    try:
        load = open("/proc/loadavg").read().split()[:3]
    except OSError:  # pragma: no cover
        load = ["?"]
    return {
        "date": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "remat": _git_state(),
        "loadavg": " ".join(load),
        "cpu": cpu_name(),
        "platform.processor()": platform.processor() or "(empty)",
        "cores": os.cpu_count(),
        "torch": torch.__version__,
        "transformers": tf,
        "python": platform.python_version(),
        "threads": threads if threads is not None else torch.get_num_threads(),
    }


def _git_state() -> str:
    """Commit of the work tree and whether src/ has uncommitted changes (the measured remat)."""
    try:
        root = HERE.parent
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True, text=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "src"], cwd=root, capture_output=True, text=True).stdout.strip()
        return f"{head}{' + uncommitted src changes' if dirty else ''}" or "unknown"
    except OSError:  # pragma: no cover
        return "unknown"


def machine_line(info: dict) -> str:
    return (
        f"{info['date']} · CPU {info['cpu']} (platform.processor()={info['platform.processor()']!s}), "
        f"{info['cores']} cores · torch {info['torch']} · transformers {info['transformers']} · "
        f"python {info['python']} · torch threads {info['threads']} · load average at start {info['loadavg']} · "
        f"remat at {info['remat']}"
    )


def md_table(headers: list[str], rows: list[list]) -> str:
    def fmt(v):
        if isinstance(v, float):
            return f"{v:,.1f}"
        return str(v)

    cells = [[fmt(v) for v in r] for r in rows]
    widths = [max(len(h), *(len(c[i]) for c in cells)) if cells else len(h) for i, h in enumerate(headers)]
    line = lambda vals: "| " + " | ".join(v.ljust(w) for v, w in zip(vals, widths)) + " |"  # noqa: E731
    out = [line(headers), "|" + "|".join("-" * (w + 2) for w in widths) + "|"]
    out += [line(c) for c in cells]
    return "\n".join(out)


def write_results(name: str, title: str, info: dict, command: str, sections: list[tuple[str, str]], data) -> Path:
    """Write results/<name>.md (human) and results/<name>.json (machine)."""
    RESULTS.mkdir(parents=True, exist_ok=True)
    md = [f"# {title}", "", f"Machine: {machine_line(info)}", "", f"Command: `{command}`", ""]
    for head, body in sections:
        if head:
            md += [f"## {head}", ""]
        md += [body, ""]
    path = RESULTS / f"{name}.md"
    path.write_text("\n".join(md))
    (RESULTS / f"{name}.json").write_text(json.dumps({"machine": info, "command": command, "data": data}, indent=1))
    return path


def run_fresh(spec: dict, env_extra: dict | None = None, timeout: int = 1800) -> dict:
    """Run benchmarks/_worker.py with `spec` in a fresh interpreter; return its RESULT json."""
    env = dict(os.environ)
    env.update(RSS_ENV)
    env.update(env_extra or {})
    env.setdefault("PYTHONWARNINGS", "ignore")
    cmd = [sys.executable, str(HERE / "_worker.py"), json.dumps(spec)]
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    for line in p.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT ") :])
    raise RuntimeError(f"worker failed for {spec}:\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}")


def cumulative_by_phase(timeline) -> dict[str, int]:
    """Max of live bytes up to the end of each phase (what max_memory_allocated shows after it)."""
    out, mx = {}, 0
    for ph, a, b in timeline.phase_spans():
        mx = max(mx, max(timeline.live_bytes[a:b]))
        out[ph] = mx
    return out
