"""The cheap meter of a step that is not profiled: the peak of its live tensor bytes, counted as the tracker counts them
(Rules 1-4 and 6-8 of NOTE [What counts as live memory] in `remat.measure.tracker`)."""

from __future__ import annotations

import weakref

import torch

from remat._torch_compat import tree_flatten
from remat._torch_compat.distributed import has_dtensor
from remat._torch_compat.fake_ops import as_the_kernel_lays_out
from remat.measure.tracker import SeesResizes, rounded_bytes, storage_of


class PeakMeter(SeesResizes):
    """The peak of live tensor bytes of a stretch of ops, and nothing else (Rules 1-4 of
    NOTE [What counts as live memory]): the cheap meter of a step that is not profiled."""

    def __init__(self, state: list[torch.Tensor], rounding: int = 1, skip_host: bool = False):
        super().__init__()
        self.rounding = rounding
        self.skip_host = skip_host  # Rule 8
        self.live_bytes = 0
        self.peak_bytes = 0
        self._live: dict[int, int] = {}
        for t in state:
            self.see(t)
        self.peak_bytes = self.live_bytes

    def see(self, t: torch.Tensor) -> None:
        st = storage_of(t, self.skip_host)
        if st is None or id(st) in self._live:
            return
        key, n = id(st), rounded_bytes(st.nbytes(), self.rounding)
        self._live[key] = n
        self.live_bytes += n
        weakref.finalize(st, self._freed, key)

    def _freed(self, key: int) -> None:
        self.live_bytes -= self._live.pop(key, 0)

    def resized(self, st: torch.UntypedStorage) -> None:
        known = id(st) in self._live
        self.live_bytes -= self._live.pop(id(st), 0)
        if st.nbytes():
            n = rounded_bytes(st.nbytes(), self.rounding)
            if not known:
                weakref.finalize(st, self._freed, id(st))
            self._live[id(st)] = n
            self.live_bytes += n
            self.peak_bytes = max(self.peak_bytes, self.live_bytes)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if has_dtensor(types):  # Rule 6 of NOTE [What counts as live memory]
            return NotImplemented
        kwargs = kwargs or {}
        for a in tree_flatten((args, kwargs))[0]:
            if isinstance(a, torch.Tensor):
                self.see(a)
        out = as_the_kernel_lays_out(func, func(*args, **kwargs), args)
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor):
                self.see(t)
        self.peak_bytes = max(self.peak_bytes, self.live_bytes)
        return out
