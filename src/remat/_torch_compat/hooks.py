"""Global module hooks: torch's handle for one registered with kwargs does not remove all of it."""

from __future__ import annotations

import torch
from torch.nn.modules.module import register_module_forward_hook


class _GlobalHookHandle:
    """A global forward hook's handle whose `remove()` drops the hook's with_kwargs flag too."""

    def __init__(self, handle) -> None:
        self.handle = handle

    def remove(self) -> None:
        self.handle.remove()
        torch.nn.modules.module._global_forward_hooks_with_kwargs.pop(self.handle.id, None)  # private


def global_forward_hook_with_kwargs(hook) -> _GlobalHookHandle:
    """`torch.nn.modules.module.register_module_forward_hook(hook, with_kwargs=True)`, with a handle that removes
    all of it.  torch's handle (2.13) leaves the hook's id in `_global_forward_hooks_with_kwargs`, so that
    `torch.compile(module)` warns at every later call of "global hooks on modules" that are gone (seen after each
    `remat.profile`: in the user's own loop, and in `remat plan --compile`'s output)."""
    return _GlobalHookHandle(register_module_forward_hook(hook, with_kwargs=True))
