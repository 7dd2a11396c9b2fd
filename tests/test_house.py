"""The house rules of src/remat (docs/architecture.md), checked on the source itself.

- The parts (each folder, and each top-level module) import each other without a
  cycle, counting imports made inside functions.
- No function is longer than MAX_FUNCTION_LINES or takes more than
  MAX_POSITIONAL positional parameters; no file is longer than MAX_FILE_LINES (in
  benchmarks/ too); benchmarks/ has fewer lines of Python than tests/.
- Data (remat.types) imports no other part but errors; reports read data and never
  measure, plan or apply.
- A NOTE's name is on one line (grep finds it); the public entry points have their own docstrings.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src" / "remat"
MAX_FUNCTION_LINES = 50
MAX_POSITIONAL = 6
MAX_FILE_LINES = 400


def _files() -> list[Path]:
    return sorted(SRC.rglob("*.py"))


def _sized_files() -> list[Path]:
    """What the size rules read: the package and the benchmarks."""
    return _files() + sorted((ROOT / "benchmarks").rglob("*.py"))


def _lines(folder: str) -> int:
    return sum(len(p.read_text().splitlines()) for p in (ROOT / folder).rglob("*.py"))


def _module(path: Path) -> str:
    parts = path.relative_to(SRC.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _part(module: str) -> str | None:
    """`remat.planner.dp` -> "planner", `remat.zoo` -> "zoo"; the package face `remat` itself -> None."""
    pieces = module.split(".")
    return pieces[1] if len(pieces) > 1 else None


def _imports(path: Path) -> set[str]:
    """Every remat module `path` imports, at the top or inside a function."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("remat")}
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("remat"):
            found.add(node.module)
    return found


def part_graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for path in _files():
        source = _part(_module(path))
        if source is None:
            continue
        targets = {_part(m) for m in _imports(path)} - {None, source}
        graph.setdefault(source, set()).update(targets)
    return graph


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of the graph as a path, or None (depth-first search)."""
    state: dict[str, int] = {}  # 1: on the stack, 2: done

    def visit(node: str, stack: list[str]) -> list[str] | None:
        state[node] = 1
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt) :] + [node, nxt] if nxt in stack else [node, nxt]
            if nxt not in state:
                found = visit(nxt, stack + [node])
                if found:
                    return found
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state:
            found = visit(node, [])
            if found:
                return found
    return None


def test_parts_import_each_other_without_a_cycle():
    assert _cycle(part_graph()) is None, f"import cycle between parts: {' -> '.join(_cycle(part_graph()))}"


def test_the_cycle_finder_finds_a_cycle():
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) is not None
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": set()}) is None


@pytest.mark.parametrize(
    "part, allowed",
    [
        ("types", {"errors"}),
        ("report", {"types", "errors"}),
        ("module_tree", {"errors", "_torch_compat"}),
        ("planner", {"types", "errors", "module_tree"}),
    ],
)
def test_data_and_reports_stay_downstream(part, allowed):
    assert part_graph().get(part, set()) <= allowed, f"{part} imports {part_graph()[part] - allowed}"


def _functions(tree: ast.AST):
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield node


def _positional(fn: ast.FunctionDef) -> int:
    names = [a.arg for a in fn.args.posonlyargs + fn.args.args]
    return len([n for n in names if n not in ("self", "cls")])


def test_no_long_function_and_no_long_parameter_list():
    long, wide = [], []
    for path in _sized_files():
        for fn in _functions(ast.parse(path.read_text())):
            where = f"{path.relative_to(ROOT)}:{fn.lineno} {fn.name}"
            if fn.end_lineno - fn.lineno + 1 > MAX_FUNCTION_LINES:
                long.append(f"{where} ({fn.end_lineno - fn.lineno + 1} lines)")
            if _positional(fn) > MAX_POSITIONAL:
                wide.append(f"{where} ({_positional(fn)} positional parameters)")
    assert not long and not wide, "\n".join(long + wide)


def test_no_long_file():
    long = [
        f"{p.relative_to(ROOT)} ({n} lines)"
        for p in _sized_files()
        if (n := len(p.read_text().splitlines())) > MAX_FILE_LINES
    ]
    assert not long, "\n".join(long)


def test_the_benchmarks_are_smaller_than_the_tests():
    """What measures remat (benchmarks/) does not outgrow what checks it (tests/): one worker, one model registry
    on remat.zoo, one table renderer (`_common.md_table`) keep it so."""
    assert _lines("benchmarks") < _lines("tests"), (_lines("benchmarks"), _lines("tests"))


def test_a_note_is_named_on_one_line():
    """`grep -rn "NOTE \\[Name\\]"` finds every reference: a note's name is never broken across lines."""
    broken = [
        f"{p.relative_to(SRC)}:{i}"
        for p in _files()
        for i, line in enumerate(p.read_text().splitlines(), 1)
        if "NOTE [" in line and "]" not in line[line.rindex("NOTE [") :]
    ]
    assert not broken, "\n".join(broken)


def test_the_public_entry_points_have_their_own_docstrings():
    """`help(remat.profile)` documents remat.profile (not the eager measurement it calls), with every option."""
    import inspect

    import remat
    from remat.measure import profile as eager

    assert remat.profile.__doc__ != eager.__doc__ and "compiled" in remat.profile.__doc__
    assert "keep_output" in inspect.signature(remat.profile).parameters and remat.auto.__doc__


def test_a_profiles_words_are_enums_and_its_json_keeps_the_strings():
    """`StepProfile.mode`, `.step` and `.parallel` are `Mode`, `Step` and `ParallelKind` however the profile was made
    (here from JSON written with plain strings); `to_json` writes the same strings back."""
    import json

    import torch

    import remat
    from remat.types import Mode, ParallelKind, Step

    prof = remat.profile(torch.nn.Linear(4, 4), torch.randn(2, 4), mode="fake")
    again = remat.StepProfile.from_json(prof.to_json())
    assert (type(again.mode), type(again.step), type(again.parallel)) == (Mode, Step, ParallelKind)
    data = json.loads(again.to_json())
    assert (data["mode"], data["step"], data["parallel"]) == ("fake", "steady", "")


def _command_blocks(text: str) -> list[list[str]]:
    """The fenced blocks of a Markdown page that begin with a `$ remat ...` command, as lists of lines."""
    blocks, lines, inside = [], text.splitlines(), None
    for line in lines:
        if line.startswith("```"):
            if inside is not None and inside and inside[0].startswith("$ remat "):
                blocks.append(inside)
            inside = None if inside is not None else []
        elif inside is not None:
            inside.append(line)
    return blocks


def test_every_pasted_command_in_the_docs_shows_its_output():
    """docs/fit.md once showed two `remat fit` commands with nothing under them (a shell expansion had eaten the
    pasted output): every block that starts with a `$ remat` command must show what it printed."""
    empty = [
        f"{page.relative_to(ROOT)}: {block[0]}"
        for page in sorted((ROOT / "docs").glob("*.md"))
        for block in _command_blocks(page.read_text(encoding="utf-8"))
        if not [line for line in block[1:] if line.strip() and not line.startswith("$ ")]
    ]
    assert not empty, "\n".join(empty)
