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
import tempfile
import threading
import time
from pathlib import Path

import torch

from remat.verifier.process import PROCESS_ENV

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
RESULTS = HERE / "results"
WORKER = HERE / "_worker.py"
STEP = "_step.py:measure"
"""The task that measures one step of one benchmark model (`run_fresh(STEP, spec)`)."""
MiB = 2**20


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


def md_table(headers: list[str], rows: list[list], *, pad: bool = True) -> str:
    """The benchmarks' one table renderer: a markdown table, floats with one decimal; columns padded to their
    widest cell, or (`pad=False`, for tables with long cells) left as they are."""
    cells = [[f"{v:,.1f}" if isinstance(v, float) else str(v) for v in r] for r in rows]
    widths = [max(len(h), *(len(c[i]) for c in cells)) if cells and pad else 0 for i, h in enumerate(headers)]
    line = lambda vals: "| " + " | ".join(v.ljust(w) for v, w in zip(vals, widths)) + " |"  # noqa: E731
    rule = "|" + "|".join("-" * (w + 2) for w in widths) + "|" if pad else "|" + "|".join("---" for _ in headers) + "|"
    return "\n".join([line(headers), rule] + [line(c) for c in cells])


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


def run_fresh(task: str, spec: dict, *, env_extra: dict | None = None, timeout: float = 1800, progress=None) -> dict:
    """Run TASK (`FILE:FUNCTION`, FILE under benchmarks/) on SPEC in a fresh interpreter: `WORKER`
    (benchmarks/_worker.py) under `fresh_env(env_extra)`; return the JSON result.  Each line the task prints
    goes to `progress` as it comes; the child is killed after `timeout` seconds.  A task that fails raises
    RuntimeError with the end of its output."""
    with tempfile.TemporaryDirectory(prefix="remat-bench-") as tmp:
        spec_path, out_path = Path(tmp) / "spec.json", Path(tmp) / "out.json"
        spec_path.write_text(json.dumps(spec))
        cmd = [sys.executable, str(WORKER), task, str(spec_path), str(out_path)]
        child = subprocess.Popen(
            cmd, env=fresh_env(env_extra), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        timer = threading.Timer(timeout, child.kill)
        timer.start()
        lines = []
        try:
            for line in child.stdout or ():
                lines.append(line)
                if progress is not None:
                    progress(line.rstrip())
        finally:
            rc = child.wait()
            timer.cancel()
        if rc != 0 or not out_path.exists():
            raise RuntimeError(f"worker {task} exited {rc} for {spec}:\n{''.join(lines)[-3000:]}")
        return json.loads(out_path.read_text())


def cumulative_by_phase(timeline) -> dict[str, int]:
    """Max of live bytes up to the end of each phase (what max_memory_allocated shows after it)."""
    out, mx = {}, 0
    for ph, a, b in timeline.phase_spans():
        mx = max(mx, max(timeline.live_bytes[a:b]))
        out[ph] = mx
    return out


def describe_plan(plan) -> str:
    """A plan in a few words: "2 ckpt + 1 selective", "compile budget 0.9", "compile budget 0.9 + 4 ckpt"."""
    sel = len(getattr(plan, "selective", []))
    ours = f"{len(plan.segments)} ckpt" + (f" + {sel} selective" if sel else "")
    if getattr(plan, "compiler_budget", 1.0) < 1.0:  # the compiler's budget, alone or over remat's checkpoints
        return f"compile budget {plan.compiler_budget:g}" + (f" + {ours}" if plan.segments or sel else "")
    return ours
