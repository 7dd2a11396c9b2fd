"""Suite-wide settings: one intra-op thread.

On the 2-core machines this project runs on, two intra-op threads make small steps
10-20x slower when anything else runs; tests assert bytes and FLOPs, never times.
"""

import torch

torch.set_num_threads(1)
