"""What the peers workers measure of one strategy on one Bench: the process peak of a step,
FLOPs, gradients.  The process's memory counters are `remat.verifier.process`'s."""

from __future__ import annotations

import gc

import torch
from torch.utils.flop_counter import FlopCounterMode

try:  # imported here, before a worker reads its baseline RSS, so that its code is not counted
    import transformers

    transformers.logging.set_verbosity_error()
except ImportError:  # pragma: no cover
    pass

from remat._torch_compat import flop_formulas
from remat.procmem import release_free_heap
from remat.verifier.process import high_water_mark_bytes, reset_high_water_mark, resident_bytes

from _models import input_tensors


def storages_bytes(tensors) -> int:
    seen, total = set(), 0
    for t in tensors:
        if not isinstance(t, torch.Tensor):
            continue
        s = t.untyped_storage()
        key = s.data_ptr()
        if key in seen:
            continue
        seen.add(key)
        total += s.nbytes()
    return total


def static_bytes(bench) -> int:
    """Bytes that exist before a step and that the fresh-process method counts in its figure:
    parameters, buffers, inputs."""
    m = bench.model
    return storages_bytes(list(m.parameters()) + list(m.buffers()) + input_tensors(bench.inputs))


def zero_grads(model) -> None:
    for p in model.parameters():
        p.grad = None


def adam_params(params):
    # lr 0: Adam allocates and updates its state exactly as in training, the weights stay put,
    # so every strategy sees the same model.
    return torch.optim.Adam(params, lr=0.0)


def adam(model):
    return adam_params(model.parameters())


def step(bench, fn, opt) -> None:
    """forward, loss, backward, optimizer step (what remat.profile measures)."""
    loss = fn()
    loss.backward()
    if opt is not None:
        opt.step()
    del loss


def rss_step_peak(bench, fn) -> int:
    """The process method of MEASURING.md with the peak reset instead of a fresh process:
    peak RSS during one step (fresh Adam, state made in the step) minus RSS just before it,
    plus the parameters, buffers and inputs that existed before (which the fresh-process
    figure counts).  The heap's free pages are given back first (`release_free_heap`): from 2026-12-05; before,
    a step reused what earlier steps had freed on the heap unseen, by up to 8 MiB on the Llama's 29 MiB step."""
    zero_grads(bench.model)
    opt = adam(bench.model)
    gc.collect()
    gc.disable()
    try:
        release_free_heap()
        reset_high_water_mark()
        before = resident_bytes()
        step(bench, fn, opt)
        peak = high_water_mark_bytes()
    finally:
        gc.enable()
    zero_grads(bench.model)
    del opt
    gc.collect()
    return peak - before + static_bytes(bench)


def flops_and_grads(bench, fn):
    """FlopCounterMode total of forward + backward from seed 0, and the gradients."""
    with FlopCounterMode(display=False, custom_mapping=flop_formulas()) as fc:  # remat's formulas (GQA)
        grads = grads_of(bench, fn)
    return fc.get_total_flops(), grads


def grads_of(bench, fn):
    """The gradients of one forward + backward from seed 0, by parameter name."""
    zero_grads(bench.model)
    torch.manual_seed(0)
    fn().backward()
    grads = named_grads(bench)
    zero_grads(bench.model)
    return grads


def named_grads(bench) -> dict:
    """Gradients by the parameter's name in the unmodified model (wrappers rename parameters)."""
    return {bench.param_names[id(p)]: p.grad.detach().clone() for p in bench.model.parameters() if p.grad is not None}


def compare_grads(ref: dict, got: dict) -> dict:
    """{'equal': bit-exact, 'max_abs': largest |difference|, 'rel': that over the largest |ref|}."""
    if set(ref) != set(got):
        return {
            "equal": False,
            "max_abs": float("inf"),
            "rel": float("inf"),
            "note": f"different parameters got gradients: {sorted(set(ref) ^ set(got))[:3]}",
        }
    diff = max(((got[n] - ref[n]).abs().max().item() if ref[n].numel() else 0.0) for n in ref)
    scale = max((ref[n].abs().max().item() if ref[n].numel() else 0.0) for n in ref) or 1.0
    equal = all(torch.equal(ref[n], got[n]) for n in ref)
    return {"equal": equal, "max_abs": diff, "rel": diff / scale}
