"""remat where users already train: callbacks for Hugging Face's Trainer and Lightning (docs/integrations.md).

    from remat.integrations import RematCallback            # transformers.Trainer (peft models too)
    from remat.integrations import RematLightningCallback   # lightning.pytorch.Trainer

Each imports its framework when first named here, never with `import remat` (remat needs neither).
"""

from __future__ import annotations

import importlib

_WHERE = {"RematCallback": "transformers", "RematLightningCallback": "lightning"}

__all__ = sorted(_WHERE)


def __getattr__(name: str):
    if name not in _WHERE:
        raise AttributeError(f"module 'remat.integrations' has no attribute {name!r}")
    return getattr(importlib.import_module(f"remat.integrations.{_WHERE[name]}"), name)
