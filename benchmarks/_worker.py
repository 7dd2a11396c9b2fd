"""The benchmarks' one fresh-process worker (started by `_common.run_fresh`, not by hand):

    python benchmarks/_worker.py FILE:FUNCTION SPEC.json OUT.json

imports FILE (a script under benchmarks/, e.g. `peers/worker_eager.py`; its imports happen here, before the
function reads any memory baseline), calls FUNCTION(spec) and writes its JSON result to OUT.json.  What the task
prints is its progress, which `run_fresh` passes on as it comes.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def main(task: str, spec_path: str, out_path: str) -> None:
    file, _, function = task.partition(":")
    path = HERE / file
    sys.path[:0] = [str(path.parent), str(HERE)]
    found = importlib.util.spec_from_file_location(path.stem, path)
    assert found is not None and found.loader is not None, f"no such task file: {path}"
    module = importlib.util.module_from_spec(found)
    sys.modules[path.stem] = module
    found.loader.exec_module(module)
    result = getattr(module, function)(json.loads(Path(spec_path).read_text()))
    Path(out_path).write_text(json.dumps(result))


if __name__ == "__main__":
    main(*sys.argv[1:])
