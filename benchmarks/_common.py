"""The benchmarks' one helpers module: machine description, tables, dated results, runs in a
fresh interpreter.  Nothing here is part of the `remat` package; the process's memory counters
(statm, VmHWM, clear_refs) are the package's own, `remat.verifier.process`."""

from __future__ import annotations

import datetime as _dt
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

import torch

from remat.verifier.process import PROCESS_ENV

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
RESULTS = HERE / "results"
WORKER = HERE / "_worker.py"
MiB = 2**20
RESULT = "RESULT "
"""The line a fresh-interpreter worker prints its JSON result on."""


# -- the machine ---------------------------------------------------------------------------------


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


def load_average() -> list[str]:
    """The 1, 5 and 15 minute load averages, as /proc/loadavg writes them (["?"] without /proc)."""
    try:
        return open("/proc/loadavg").read().split()[:3]
    except OSError:  # pragma: no cover
        return ["?"]


def git_state() -> dict:
    """The commit the run measured, and whether src/ differed from it (uncommitted edits)."""

    def git(*args: str) -> str:
        try:
            return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, timeout=30).stdout.strip()
        except (OSError, subprocess.SubprocessError):  # pragma: no cover
            return ""

    return {"commit": git("rev-parse", "--short", "HEAD"), "src_dirty": bool(git("status", "--porcelain", "--", "src"))}


def machine_info(threads: int | None = None) -> dict:
    try:
        import transformers  # optional: only its version is recorded

        tf = transformers.__version__
    except ImportError:  # pragma: no cover
        tf = "not installed"
    git = git_state()
    return {
        "date": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "remat": f"{git['commit']}{' + uncommitted src changes' if git['src_dirty'] else ''}" or "unknown",
        "loadavg": " ".join(load_average()),
        "cpu": cpu_name(),
        "platform.processor()": platform.processor() or "(empty)",
        "cores": os.cpu_count(),
        "torch": torch.__version__,
        "transformers": tf,
        "python": platform.python_version(),
        "threads": threads if threads is not None else torch.get_num_threads(),
    }


def machine_line(info: dict) -> str:
    return (
        f"{info['date']} · CPU {info['cpu']} (platform.processor()={info['platform.processor()']!s}), "
        f"{info['cores']} cores · torch {info['torch']} · transformers {info['transformers']} · "
        f"python {info['python']} · torch threads {info['threads']} · load average at start {info['loadavg']} · "
        f"remat at {info['remat']}"
    )


# -- tables and results --------------------------------------------------------------------------


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


def results_markdown(title: str, info: dict, command: str, sections: list[tuple[str, str]]) -> str:
    """The dated document of one benchmark: title, machine, command, then each (heading, body)."""
    md = [f"# {title}", "", f"Machine: {machine_line(info)}", "", f"Command: `{command}`", ""]
    for head, body in sections:
        if head:
            md += [f"## {head}", ""]
        md += [body, ""]
    return "\n".join(md)


def write_results(name: str, title: str, info: dict, command: str, sections: list[tuple[str, str]], data) -> Path:
    """Write results/<name>.md (human) and results/<name>.json (machine)."""
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{name}.md"
    path.write_text(results_markdown(title, info, command, sections))
    (RESULTS / f"{name}.json").write_text(json.dumps({"machine": info, "command": command, "data": data}, indent=1))
    return path


def timed(fn) -> float:
    """Wall-clock seconds of `fn()`."""
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


# -- fresh interpreters --------------------------------------------------------------------------


def fresh_env(extra: dict | None = None) -> dict:
    """The environment of a measuring child: this one, `PROCESS_ENV` (resident memory follows the
    live tensors), warnings off, this checkout's src/ first on the path, then `extra`."""
    env = {**os.environ, **PROCESS_ENV}
    env.setdefault("PYTHONWARNINGS", "ignore")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT / "src"), env.get("PYTHONPATH", "")) if p)
    env.update(extra or {})
    return env


def run_fresh(script: str | Path, spec: dict, *, env_extra: dict | None = None, timeout: int = 1800) -> dict:
    """Run `python SCRIPT --worker SPEC` in a fresh interpreter (`fresh_env`); return its RESULT json.

    SCRIPT ends in `main_or_worker(main, worker)`; `WORKER` (benchmarks/_worker.py) measures one step
    of one benchmark model."""
    cmd = [sys.executable, str(script), "--worker", json.dumps(spec)]
    done = subprocess.run(cmd, env=fresh_env(env_extra), capture_output=True, text=True, timeout=timeout)
    for line in done.stdout.splitlines():
        if line.startswith(RESULT):
            return json.loads(line[len(RESULT) :])
    raise RuntimeError(f"worker failed for {spec}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")


def main_or_worker(main, worker) -> None:
    """A script's entry point: `--worker SPEC` (what run_fresh starts) prints `RESULT` and worker(spec)'s
    JSON; anything else runs main()."""
    if len(sys.argv) == 3 and sys.argv[1] == "--worker":
        print(RESULT + json.dumps(worker(json.loads(sys.argv[2]))), flush=True)
    else:
        main()


def cumulative_by_phase(timeline) -> dict[str, int]:
    """Max of live bytes up to the end of each phase (what max_memory_allocated shows after it)."""
    out, mx = {}, 0
    for ph, a, b in timeline.phase_spans():
        mx = max(mx, max(timeline.live_bytes[a:b]))
        out[ph] = mx
    return out
