"""Measurement helpers shared by the peers workers (process RSS, FLOPs, gradients, timing)."""

from __future__ import annotations

import gc
import os
import time

import torch
from torch.utils.flop_counter import FlopCounterMode

PAGE = os.sysconf("SC_PAGE_SIZE")
MiB = 2**20


def rss_now() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * PAGE


def hwm() -> int:
    """VmHWM: the process's peak RSS since start or since the last `reset_hwm()`."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmHWM in /proc/self/status")


def reset_hwm() -> None:
    """Linux >= 4.0: writing 5 to clear_refs resets the peak RSS (VmHWM) to the current RSS."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


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


def input_tensors(inputs) -> list[torch.Tensor]:
    if isinstance(inputs, torch.Tensor):
        return [inputs]
    vals = inputs.values() if isinstance(inputs, dict) else inputs
    return [t for t in vals if isinstance(t, torch.Tensor)]


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
    figure counts)."""
    zero_grads(bench.model)
    opt = adam(bench.model)
    gc.collect()
    gc.disable()
    try:
        reset_hwm()
        before = rss_now()
        step(bench, fn, opt)
        peak = hwm()
    finally:
        gc.enable()
    zero_grads(bench.model)
    del opt
    gc.collect()
    return peak - before + static_bytes(bench)


def flops_and_grads(bench, fn):
    """FlopCounterMode total of forward + backward from seed 0, and the gradients."""
    zero_grads(bench.model)
    torch.manual_seed(0)
    with FlopCounterMode(display=False) as fc:
        loss = fn()
        loss.backward()
    grads = named_grads(bench)
    zero_grads(bench.model)
    return fc.get_total_flops(), grads


def grads_of(bench, fn):
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
        return {"equal": False, "max_abs": float("inf"), "rel": float("inf"),
                "note": f"different parameters got gradients: {sorted(set(ref) ^ set(got))[:3]}"}
    diff = max(((got[n] - ref[n]).abs().max().item() if ref[n].numel() else 0.0) for n in ref)
    scale = max((ref[n].abs().max().item() if ref[n].numel() else 0.0) for n in ref) or 1.0
    equal = all(torch.equal(ref[n], got[n]) for n in ref)
    return {"equal": equal, "max_abs": diff, "rel": diff / scale}


def timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0
