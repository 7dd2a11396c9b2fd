"""nn.Sequential modules whose forward the profiled step never ran, their children called by the model itself.

NOTE [An nn.Sequential the model never calls]
  Rule 1. A model may call an nn.Sequential's children itself (`x = layer[2](layer[1](layer[0](x)))`,
          `for m in self.seq: x = m(x)`, `self.seq[i](x, mask)`, torch's checkpoint_sequential): the
          Sequential's forward never runs, so a checkpoint on that forward would never run either, and
          nothing may rest on it chaining its children (NOTE [How a module is checkpointed in place],
          Rule 4).  The profile records which forwards ran (`BlockIO.forward_ran`); the children of such
          a Sequential get the container kind CALLED_DIRECTLY, and a run of them is one checkpoint as a
          run of nn.ModuleList entries is (NOTE [A run of nn.ModuleList entries as one checkpoint]).
  Rule 2. Such a Sequential that is itself a candidate (an entry of an nn.ModuleList, a child of another
          nn.Sequential) is a block of the profile when its children ran in turn: each once, in the order
          they are registered, with no op between one and the next that reads a tensor requiring grad.
          It stands for the run of its children: the first one's inputs, the last one's output, their
          ops.  `Plan.called_directly` names it, and remat.apply checkpoints it as that run.
  Rule 3. Otherwise (a child not called, called twice or out of turn, code joining the graph between
          two) it is no block: its children are planned one by one, or in runs the planner can prove.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from remat.measure.tracker import Tracker
from remat.module_tree import children_of, runs_children_in_order, within

if TYPE_CHECKING:
    from remat.measure.block_io import BlockIO


def uncalled_chains(tracker: Tracker, io: "BlockIO") -> dict[str, list[str]]:
    """{candidate nn.Sequential the step never called: its children} for those whose children ran in turn
    (Rule 2), the innermost first (a Sequential of such Sequentials is one when they are)."""
    found: dict[str, list[str]] = {}
    for name in sorted(io.modules, key=lambda n: -n.count(".")):
        module = io.modules[name]
        if id(module) in io.forward_ran or not runs_children_in_order(module):
            continue
        children = children_of(name, module)
        if children and all(c in found or io.calls.get(c) == 1 for c in children) and _in_turn(children, tracker, io):
            found[name] = children
    return found


def with_chains(order: list[str], chains: dict[str, list[str]], io: "BlockIO") -> list[str]:
    """`order` (the candidates that ran, by first call) with each of `chains` just before its first child, its
    inputs, output and one call those of its run (Rule 2).  Sets them on `io` once: a profile built again
    (kernel scratch measured) finds them there."""
    first: dict[str, list[str]] = {}
    for name in chains:  # innermost first: a chain's first child that is a chain has its inputs already
        head, tail = _leaf(name, chains, 0), _leaf(name, chains, -1)
        io.calls.setdefault(name, 1)
        io.inputs.setdefault(name, io.inputs.get(head, []))
        io.outputs.setdefault(name, io.outputs.get(tail, []))
        first.setdefault(head, []).insert(0, name)  # outer chains come later here, and go first in the order
    return [m for n in order for m in [*first.get(n, []), n]]


def _leaf(name: str, chains: dict[str, list[str]], end: int) -> str:
    """The first (`end` 0) or last (-1) module that ran of the run `name` stands for."""
    while name in chains:
        name = chains[name][end]
    return name


def _in_turn(children: list[str], tracker: Tracker, io: "BlockIO") -> bool:
    """The children's forwards ran one after another in registration order, nothing that joins the graph
    between two of them."""
    ops = tracker.ops
    spans = []
    for c in children:
        mine = [
            k
            for k, op in enumerate(ops)
            if op.phase in ("forward", "loss") and not op.recompute and within(op.module, c)
        ]
        if mine:
            spans.append((mine[0], mine[-1]))
    if not spans:
        return False
    return all(
        last < start and not any(op.reads_grad for op in ops[last + 1 : start])
        for (_, last), (start, _) in zip(spans, spans[1:])
    )
