"""The benchmarks' harness: one model registry (`benchmarks/_catalog.py`, `_models.py`, built on remat.zoo) and one
fresh-process worker (`_common.run_fresh` running `benchmarks/_worker.py`)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"
pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def harness():
    saved = list(sys.path)
    sys.path.insert(0, str(BENCH))
    try:
        import _catalog
        import _common
        import _models

        yield _catalog, _models, _common
    finally:
        sys.path[:] = saved


def test_every_size_names_models_the_registry_builds(harness):
    catalog, models, _ = harness
    named = {m for size in catalog.SIZES.values() for m in size}
    assert named <= set(models.MODELS), named - set(models.MODELS)
    for lineup, size in [(catalog.ORDER, "quick"), (catalog.LARGE_ORDER, "large"), (catalog.GPU_CHECK, "smoke")]:
        assert set(lineup) <= set(catalog.SIZES[size]), (size, set(lineup) - set(catalog.SIZES[size]))
    assert set(catalog.ISSUE36) <= set(catalog.SIZES["issue"]) and set(catalog.TITLES) >= set(catalog.ORDER)


def test_each_peers_model_names_blocks_it_has(harness):
    """What "every block" and selective checkpointing wrap, and the list checkpoint_sequential runs, exist in the
    model the registry builds."""
    catalog, models, _ = harness
    for name in catalog.ORDER:
        bench = models.make_bench(name, "quick")
        assert bench.blocks, name
        for block in bench.blocks:
            bench.model.get_submodule(block)
        assert bench.sequence is not None or bench.no_sequence_why, name
        if bench.sequence is not None:
            assert all(isinstance(m, models.nn.Module) for m in bench.sequence(bench.model))
    with pytest.raises(ValueError, match="names no blocks"):  # a worker model, no Hugging Face layers either
        models.make_bench("chain", "worker")


def test_the_worker_returns_the_tasks_result_or_raises_with_its_output(harness):
    _, _, common = harness
    spec = {"model": "chain", "method": "fake", "kwargs": {"width": 64, "blocks": 4, "batch": 32}}
    res = common.run_fresh(common.STEP, spec, timeout=300)
    assert res["spec"] == spec and res["peak"] > 64 * 64 * 4 * 4  # the weights alone, in float32
    lines = []
    with pytest.raises(RuntimeError, match="exited 1") as failed:
        common.run_fresh(common.STEP, {"model": "no such model", "method": "fake"}, timeout=300, progress=lines.append)
    assert "KeyError: 'no such model'" in str(failed.value) and lines
