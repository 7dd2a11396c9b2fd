"""TARGETs the process-measure tests run in a fresh interpreter (`remat.verifier.process`)."""

import torch

from remat import zoo


def chain():
    """Report 001's chain, 16 blocks of 256 at batch 8192: a ~270 MiB step made mostly of activations."""
    return zoo.chain_report001(width=256, blocks=16, batch=8192)


def gpt2():
    """`remat demo`'s model: a 4-layer GPT-2 (an attention model, Hugging Face, tied weights)."""
    return zoo.demo()


def bert():
    return zoo.bert()


def mlp():
    return zoo.mlp_report000()


def convnet():
    """A conv net with BatchNorm at a size where convolution scratch shows: ConvBNNet, 64 images of 64x64."""
    return zoo.cnn_bn(batch=64, size=64)


def cnn002():
    return zoo.cnn_report002()


def skips():
    return zoo.skipnet(width=1024, depth=4, batch=4096)


class _SelfAttention(torch.nn.Module):
    """A pre-norm transformer block written by hand: SDPA with a causal mask, a GELU MLP."""

    def __init__(self, width: int, heads: int):
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = torch.nn.LayerNorm(width), torch.nn.LayerNorm(width)
        self.qkv, self.out = torch.nn.Linear(width, 3 * width), torch.nn.Linear(width, width)
        self.mlp = torch.nn.Sequential(
            torch.nn.Linear(width, 4 * width), torch.nn.GELU(), torch.nn.Linear(4 * width, width)
        )

    def forward(self, x):
        b, s, w = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(b, s, 3, self.heads, w // self.heads).permute(2, 0, 3, 1, 4)
        a = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.out(a.transpose(1, 2).reshape(b, s, w))
        return x + self.mlp(self.norm2(x))


def attention():
    """An attention model of our own (not Hugging Face): 4 hand-written blocks, width 256, seq 512, batch 8."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[_SelfAttention(256, 4) for _ in range(4)])
    return model, (torch.randn(8, 512, 256),)


class _Kernel(torch.nn.Module):
    """A function made a module outside the model, as `kernels.use_kernel_forward_from_hub` makes Hugging Face's
    `mamba_inner_fn` one: called with what a fused kernel would take, it returns None where there is none."""

    def forward(self, a):
        return None


_KERNEL = _Kernel()


class _DeadBranch(torch.nn.Module):
    """A block that computes a sigmoid of its input it never uses (Hugging Face Mamba's mixer from transformers 5.25
    computes its A for a fused kernel and drops it on CPU), optionally handing it to `_KERNEL`, then a residual MLP."""

    def __init__(self, width: int, kernel: bool):
        super().__init__()
        self.lin = torch.nn.Linear(width, width)
        self.kernel = kernel

    def forward(self, x):
        unused = torch.sigmoid(x)  # sigmoid saves its own output
        if self.kernel:
            _KERNEL(unused)
        return x + self.lin(torch.tanh(x))


def dead_branches(kernel: bool = False):
    """3 `_DeadBranch` blocks of width 256 at batch 8192: each unused sigmoid is 8 MiB of a ~60 MiB step."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[_DeadBranch(256, kernel) for _ in range(3)])
    return model, (torch.randn(8192, 256),)


def dead_branches_to_a_kernel():
    return dead_branches(kernel=True)
