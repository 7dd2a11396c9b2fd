"""The correctness findings of `remat.explain` (severity CORRECTNESS): checkpoints that change
what the model learns (reentrant-no-grad-input, rng-not-preserved, rng-keyword-tensors, batchnorm-recomputed,
compile-budget-redraws-dropout).
"""

from __future__ import annotations

from remat._torch_compat import BatchNormBase as _BatchNorm
from remat.explainer.evidence import Evidence, _b, _few, dropouts
from remat.types import CheckpointRegion, Finding, Severity


def reentrant_no_grad_input(ev: Evidence) -> list[Finding]:
    """Reentrant checkpoint whose inputs do not require grad: the parameters inside get no gradient."""
    out = []
    for r in ev.regions:
        params = _params(ev, r.modules)
        if r.reentrant and not r.input_requires_grad and params:
            out.append(_no_grad(ev, r, params))
    return out


def _params(ev: Evidence, names) -> list:
    seen: dict[int, object] = {}
    for name in names:
        for p in ev.modules[name].parameters() if name in ev.modules else ():
            if p.requires_grad:
                seen.setdefault(id(p), p)
    return list(seen.values())


def _no_grad(ev: Evidence, r: CheckpointRegion, params: list) -> Finding:
    nbytes = sum(p.numel() * p.element_size() for p in params)
    failed = ""
    if ev.written_error:
        failed = f" Here no gradient reaches the loss at all, and the step fails ({_first_clause(ev.written_error)})."
    message = (
        f"{r.label} uses the reentrant checkpoint (use_reentrant=True, or not given: torch then picks it) and none of "
        f"its tensor inputs requires grad, so its output does not either: the {len(params)} parameter tensors inside "
        f"({_b(nbytes)}, in {_few(r.modules)}) get no gradient and "
        f"silently stop training.{failed}"
    )
    fix = (
        "Pass use_reentrant=False (torch recommends it, and it has no such requirement); or make an input require "
        "grad before the checkpoint (x.requires_grad_(); Hugging Face: model.enable_input_require_grads())."
    )
    return Finding(
        "reentrant-no-grad-input",
        r.module,
        message,
        nbytes,
        fix,
        Severity.CORRECTNESS,
        dict(params=len(params), params_bytes=nbytes),
    )


def _first_clause(error: str) -> str:
    """`remat: x does not require grad; expected ...` -> `x does not require grad`."""
    return error.removeprefix("remat: ").split(";")[0].split(". ")[0]


def rng_not_preserved(ev: Evidence) -> list[Finding]:
    """preserve_rng_state=False around dropout: the recomputation draws another mask."""
    return [_rng(ev, r) for r in ev.regions if not r.preserve_rng_state and (r.draws_random or _dropouts(ev, r))]


def _dropouts(ev: Evidence, r: CheckpointRegion) -> list[str]:
    return dropouts(ev, r.modules)


def _random_from(drops: list[str]) -> str:
    """Where a step's random numbers come from, in a finding's words: its dropout modules, or, with none of them
    named, any random op."""
    return f"dropout: {_few(drops)}" if drops else "dropout or another random op"


def _rng(ev: Evidence, r: CheckpointRegion) -> Finding:
    where = _random_from(_dropouts(ev, r))
    message = (
        f"{r.label} runs with preserve_rng_state=False and its forward draws random numbers ({where}). When "
        "backward recomputes it, dropout draws a new mask, so the gradients belong to a different network than "
        "the one that produced the loss; nothing fails, training is silently off."
    )
    fix = (
        "Drop preserve_rng_state=False: the default saves the RNG state (a few KB) and replays it in the recomputation."
    )
    return Finding("rng-not-preserved", r.module, message, 0, fix, Severity.CORRECTNESS)


def rng_keyword_tensors(ev: Evidence) -> list[Finding]:
    """Non-reentrant checkpoint around dropout whose tensors all come as keywords: right on CPU, but torch saves
    the GPU random state only for positional tensors' devices, so on a GPU the recomputation draws another mask."""
    return [
        _keywords(ev, r)
        for r in ev.regions
        if r.keyword_tensors and r.preserve_rng_state and (r.draws_random or _dropouts(ev, r))
    ]


def _keywords(ev: Evidence, r: CheckpointRegion) -> Finding:
    where = _random_from(_dropouts(ev, r))
    names = [n for n in r.keyword_tensors if n != "functools.partial"]
    given = [f"keyword argument{'s' if len(names) > 1 else ''} {', '.join(names)}"] if names else []
    given += ["tensors bound by functools.partial"] if "functools.partial" in r.keyword_tensors else []
    message = (
        f"{r.label} gets its tensors only as {' and '.join(given)}, none positional, and its forward draws random "
        f"numbers ({where}). torch's non-reentrant checkpoint saves the GPU random state only for the devices of "
        "its positional tensor arguments, so on a GPU backward recomputes it with another dropout mask and the "
        "gradients belong to a different network than the one that produced the loss; nothing fails, training is "
        "silently off. On CPU it is right (the CPU generator is always saved): a CPU run does not show it."
    )
    fix = (
        f"Pass the tensors positionally: {_positional_call(r, names)}; or let remat.apply checkpoint "
        f"{r.module or 'the model'} (remat's checkpoints show torch every tensor, however it is passed)."
    )
    return Finding("rng-keyword-tensors", r.module, message, 0, fix, Severity.CORRECTNESS)


def _positional_call(r: CheckpointRegion, names: list[str]) -> str:
    """`checkpoint(lambda x, mask: block(x=x, mask=mask), x, mask, use_reentrant=False)` for this checkpoint."""
    last = r.module.rsplit(".", 1)[-1]
    callee = last if r.kind == "module" and last.isidentifier() else "layer"
    names = [n for n in names if n.isidentifier()]
    if r.via == "checkpoint_wrapper" and names:
        return f"{callee}({', '.join(names)}) where the model calls it (checkpoint_wrapper passes them on as given)"
    if not names:
        return f"checkpoint(lambda t: {callee}(t), t, use_reentrant=False), t no longer bound by functools.partial"
    params, passed = ", ".join(names), ", ".join(f"{n}={n}" for n in names)
    return f"checkpoint(lambda {params}: {callee}({passed}), {params}, use_reentrant=False)"


def batchnorm_recomputed(ev: Evidence) -> list[Finding]:
    """BatchNorm in training mode recomputed: its running statistics are updated twice per step."""
    out = []
    for r in ev.regions:
        bns = [n for n in r.modules if n in ev.recomputed and _tracks_stats(ev.modules.get(n))]
        if bns and r.depth == 0:
            out.append(_batchnorm(ev, r, bns))
    return out


def _tracks_stats(m) -> bool:
    return isinstance(m, _BatchNorm) and m.training and m.track_running_stats


def _batchnorm(ev: Evidence, r: CheckpointRegion, bns: list[str]) -> Finding:
    nbytes = sum(b.numel() * b.element_size() for n in bns for b in ev.modules[n].buffers())
    message = (
        f"{len(bns)} BatchNorm module{'s' if len(bns) > 1 else ''} in training mode ({_few(bns)}) run again "
        f"when backward recomputes {r.label}: the running mean and "
        "variance are updated twice per step (momentum applied twice, num_batches_tracked counts 2), so the "
        "statistics used in eval drift from those of plain training."
    )
    fix = (
        "Keep BatchNorm out of the checkpointed function (checkpoint conv blocks, call the norm outside), or save and "
        "restore the running statistics around the recomputation (remat's plan, when applied, does)."
    )
    return Finding(
        "batchnorm-recomputed", r.module, message, nbytes, fix, Severity.CORRECTNESS, dict(batchnorms=len(bns))
    )


def compile_budget_redraws_dropout(ev: Evidence) -> list[Finding]:
    """torch.compile's activation memory budget set below 1.0 by hand on a model that trains with dropout: torch's
    partitioner may draw other masks in backward (NOTE [The compiler's budget as a plan], Rule 5)."""
    drops = dropouts(ev)
    if ev.compiler_budget >= 1.0 or not (drops or any(b.has_dropout for b in ev.plain.blocks)):
        return []
    where = _random_from(drops)
    message = (
        f"torch._functorch.config.activation_memory_budget is {ev.compiler_budget:g} in this process and the model "
        f"trains with random numbers ({where}). Below 1.0 torch.compile's partitioner may recompute dropout in "
        "backward, where it draws other masks than the forward did, so the compiled step's gradients belong to a "
        "different network than the one that produced the loss; nothing fails, training is silently off "
        f"({TORCH_RNG_BUG}; measured in docs/compile.md)."
        + ("" if ev.compiled else " It acts once the model runs under torch.compile.")
    )
    fix = (
        "Set the budget back to 1.0 and let remat set it: remat.auto(torch.compile(model), inputs, budget) measures "
        "torch.compile's own budget with dropout's masks kept, beside remat's checkpoints, and applies the fastest "
        "plan that fits (docs/compile.md); or train without dropout."
    )
    return [
        Finding("compile-budget-redraws-dropout", "", message, 0, fix, Severity.CORRECTNESS, dict(dropouts=len(drops)))
    ]


TORCH_RNG_BUG = "pytorch/pytorch#190758"
"""torch's issue: its partitioner re-draws random numbers in backward under a memory budget."""
