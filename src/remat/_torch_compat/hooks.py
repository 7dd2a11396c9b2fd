"""Module hooks: a global one's handle (registered with kwargs) that removes all of it, and a module's own pre-hook
removed from that module, not from the one its handle was made for."""

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


def remove_forward_pre_hook(module: torch.nn.Module, hook_id: int) -> None:
    """Remove the forward pre-hook `hook_id` from `module` itself.  `copy.deepcopy` copies a module's hooks under the
    same ids, and their handle removes from the dict it was made for only, the original's."""
    module._forward_pre_hooks.pop(hook_id, None)  # private
    module._forward_pre_hooks_with_kwargs.pop(hook_id, None)
