"""The live bytes of a step, op by op (`StepProfile.timeline`)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class Timeline:
    """Live tensor bytes after each tracked op, with the phase and module running then.

    Columnar so that the JSON of a large step stays small; `modules` are indices
    into `module_names`.
    """

    live_bytes: list[int] = field(default_factory=list)
    phases: list[str] = field(default_factory=list)
    modules: list[int] = field(default_factory=list)
    module_names: list[str] = field(default_factory=list)
    start_bytes: int = -1
    """Live tensor bytes before the first op (-1: not recorded, profiles before version 12): what a checkpoint's
    recomputation from the first op adds to (NOTE [The memory model of a plan], Rule 3)."""

    def __len__(self) -> int:
        return len(self.live_bytes)

    def phase_peak(self, phase: str) -> int:
        """The most live tensor bytes after an op of `phase` (0 where none ran)."""
        return max((b for b, ph in zip(self.live_bytes, self.phases) if ph == phase), default=0)

    def phase_spans(self) -> list[tuple[str, int, int]]:
        """[(phase, first index, last index + 1)] in order."""
        spans: list[tuple[str, int, int]] = []
        for i, ph in enumerate(self.phases):
            if spans and spans[-1][0] == ph:
                spans[-1] = (ph, spans[-1][1], i + 1)
            else:
                spans.append((ph, i, i + 1))
        return spans
