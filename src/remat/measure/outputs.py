"""What a profile of a compiled model says about the model's outputs.

NOTE [An output the loss does not read]
  Compiled, a model is one autograd node whatever it returns.  When the loss is computed inside the model (a
  Hugging Face model given labels returns `loss` and `logits`) or reads only some of its outputs, the others get
  no gradient in backward, and torch 2.13 hands the compiled backward a gradient of zeros of each of their sizes
  all the same: AOTAutograd's node lets autograd materialise the gradients it was not given
  (pytorch/pytorch#131794).  The eager step has no such tensor, so neither has its profile.
  Rule 1. An output is read by the loss when the loss's autograd graph, walked from the loss outside the model,
          reaches that output; the walk stops at each output, so it never enters the model.  A loss that is one
          of the outputs reads none of the others.
  Rule 2. Only outputs that require a gradient count: the compiled backward is given gradients for those alone.
  Measured (`python benchmarks/compiled_outputs.py`, torch 2.13 on CPU): Hugging Face's BERT for masked LM,
  2 layers of 768, batch 2 x 512, compiled: 577.7 MiB at the third step's peak as written, 489.1 with the logits
  (119.2 MiB) returned detached, 369.9 returning the loss alone; `aten.zeros` of the logits' shape made in the
  compiled backward only as written.  `tests/test_compile.py` holds torch to it.
"""

from __future__ import annotations

from typing import Any

import torch

from remat.report.text import fmt_bytes

COMPILED_NOTE = (
    "torch.compile: the model inside it was profiled, eagerly (block names are its own, so a plan applies to "
    "the compiled model and to the bare one); the compiled step's own peak is what "
    "remat.verify(compiled_model, inputs, plan) measures by the process counter (docs/compile.md)."
)


def named_tensors(out: Any, name: str = "output") -> list[tuple[str, torch.Tensor]]:
    """The tensors of a model's output with the names a user reads them by: `logits` of a Hugging Face output or
    a dict, `output[1]` of a tuple, `output` itself."""
    if isinstance(out, torch.Tensor):
        return [(name, out)]
    if isinstance(out, dict):  # a Hugging Face ModelOutput is an OrderedDict
        return [item for key, value in out.items() for item in named_tensors(value, str(key))]
    if isinstance(out, (tuple, list)):
        return [item for i, value in enumerate(out) for item in named_tensors(value, f"{name}[{i}]")]
    return []


def unread_outputs(out: Any, loss: torch.Tensor) -> list[tuple[str, int]]:
    """Rules 1 and 2: (name, bytes) of each output that requires a gradient and that `loss` does not read; a tensor
    returned twice is named once, by its first name."""
    named = named_tensors(out)
    first: dict[int, tuple[str, torch.Tensor]] = {}
    for n, t in named:
        first.setdefault(id(t), (n, t))
    wanted = [(n, t) for n, t in first.values() if t.requires_grad and t.grad_fn is not None and t is not loss]
    if any(t is loss for _, t in named):
        return [(n, t.numel() * t.element_size()) for n, t in wanted]
    edges = {(t.grad_fn, t.output_nr): n for n, t in wanted}
    read: set[str] = set()
    seen, todo = set(), [loss.grad_fn]
    while todo:
        node = todo.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        for edge in node.next_functions:
            if edge in edges:
                read.add(edges[edge])
            else:
                todo.append(edge[0])
    return [(n, t.numel() * t.element_size()) for n, t in wanted if n not in read]


def unread_note(unread: list[tuple[str, int]]) -> list[str]:
    """NOTE [An output the loss does not read]: what a compiled backward is given for `unread`, in one note."""
    if not unread:
        return []
    names = ", ".join(f"`{n}` ({fmt_bytes(b, 'auto')})" for n, b in unread)
    return [
        f"compiled step: the model returns {names} beside its loss, which does not read "
        f"{'them' if len(unread) > 1 else 'it'}; torch 2.13 hands the compiled backward a gradient of zeros of "
        f"that size all the same ({fmt_bytes(sum(b for _, b in unread), 'auto')} the eager step profiled here "
        "does not hold; pytorch/pytorch#131794). Compile a function that returns only what the loss reads, e.g. "
        "torch.compile(lambda batch: model(**batch).loss), or return those outputs detached (docs/compile.md)."
    ]
