"""Try Rockmate 2.0 as shipped on PyPI, without patching it and without touching the project's
environment: download the sdists, install them with `pip install --target` into a throwaway
directory, then import and run it on a tiny model in a subprocess.  Records what happened.

    python benchmarks/peers/rockmate_probe.py          # ~1 min (network: PyPI)

Writes benchmarks/results/peers_rockmate.json, which `run.py` reads for its Rockmate column.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
OUT = HERE.parent / "results" / "peers_rockmate.json"

# Rockmate's own declared dependencies that the project's environment lacks (torch and numpy are
# already importable; `--target` would otherwise download a second torch).
EXTRA_DEPS = ["pulp==2.7.0", "configmypy>=0.2.0", "astunparse>=1.6.3"]

TRY = r"""
import json, sys, time, traceback
res = {}
try:
    import torch
    res["cuda_available"] = torch.cuda.is_available()
    t0 = time.perf_counter()
    import rkgb
    res["rkgb_file"] = getattr(rkgb, "__file__", None)
    import rockmate
    res["import"] = "ok"
    model = torch.nn.Sequential(*[torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.ReLU()) for _ in range(8)])
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    model = model.to(dev)
    x = torch.randn(512, 256, device=dev)
    rk = rockmate.Rockmate(model, x, budget=2**20)  # the README's entry point
    loss = rk(x).sum(); loss.backward(); rk.backward() if hasattr(rk, "backward") else None
    res["run"] = "ok"
    res["plan_s"] = time.perf_counter() - t0
except BaseException as e:  # record whatever stops it
    res["error"] = f"{type(e).__name__}: {e}"
    res["traceback_tail"] = traceback.format_exc().strip().splitlines()[-6:]
print("PROBE " + json.dumps(res))
"""


def sh(cmd: list[str], **kw) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, **kw)


def main() -> dict:
    res: dict = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    with tempfile.TemporaryDirectory(prefix="rockmate-probe-") as tmp:
        dl, site = Path(tmp) / "dl", Path(tmp) / "site"
        p = sh([sys.executable, "-m", "pip", "download", "--no-deps", "-d", str(dl), "rockmate", "rkgb"])
        res["download_rc"] = p.returncode
        res["downloaded"] = sorted(f.name for f in dl.glob("*")) if dl.exists() else []
        for f in dl.glob("rkgb-*.tar.gz") if dl.exists() else []:
            with tarfile.open(f) as tf:
                pkgs = sorted({n.split("/src/rkgb/", 1)[1].split("/")[0] for n in tf.getnames() if "/src/rkgb/" in n})
            res["rkgb_sdist_contents"] = pkgs
            res["rkgb_missing_packages"] = [d for d in ("core", "lowlevel", "utils") if d not in pkgs]
        p = sh(
            [
                sys.executable,
                "-m",
                "pip",
                "install",
                "--no-deps",
                "--target",
                str(site),
                *map(str, dl.glob("*.tar.gz")),
                *EXTRA_DEPS,
            ]
        )
        res["install_rc"] = p.returncode
        if p.returncode:
            res["install_tail"] = (p.stdout + p.stderr).strip().splitlines()[-5:]
        env = dict(os.environ, PYTHONPATH=str(site))
        p = sh([sys.executable, "-c", TRY], env=env, timeout=600, cwd=tmp)
        line = [ln for ln in p.stdout.splitlines() if ln.startswith("PROBE ")]
        res["probe"] = json.loads(line[-1][6:]) if line else {"error": (p.stdout + p.stderr)[-2000:]}
    probe = res["probe"]
    runnable = probe.get("run") == "ok"
    res["runnable"] = runnable
    if runnable:
        res["status"] = "runs"
    else:
        why = []
        if res.get("rkgb_missing_packages"):
            why.append(f"rkgb 2.0.0 sdist lacks {', '.join(res['rkgb_missing_packages'])}/")
        if not probe.get("cuda_available", False):
            why.append("CUDA-only code, no GPU here")
        res["status"] = "not runnable on CPU (" + "; ".join(why or [probe.get("error", "?")]) + ")"
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(res, indent=1))
    return res


if __name__ == "__main__":
    r = main()
    print(json.dumps(r, indent=1))
