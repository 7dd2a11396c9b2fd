"""Classes of aten ops remat treats specially, by packet name ("mm" for aten.mm.default)."""

from __future__ import annotations

RANDOM_OPS = frozenset(  # ops that draw from the random generator (dropout and friends)
    {
        "native_dropout",
        "bernoulli",
        "bernoulli_",
        "rand",
        "rand_like",
        "randn",
        "randn_like",
        "randint",
        "randint_like",
        "randperm",
        "uniform_",
        "normal_",
        "multinomial",
    }
)

# Ops whose outputs selective checkpointing keeps (the expensive ones, as in torchtitan's policy)
SAVE_OPS = frozenset(
    {
        "mm",
        "addmm",
        "bmm",
        "baddbmm",
        "convolution",
        "_convolution",
        "mkldnn_convolution",
        "cudnn_convolution",
        "_scaled_dot_product_flash_attention_for_cpu",
        "_scaled_dot_product_flash_attention",
        "_scaled_dot_product_efficient_attention",
        "_scaled_dot_product_cudnn_attention",
    }
)


def op_signature(name: str, tensors) -> str:
    """An op's name and the shapes of its tensor arguments, in order: "addmm(768, 2048x256, 256x768)".
    Selective checkpointing picks the outputs it keeps by this
    (NOTE [Which outputs a selective checkpoint keeps]): it tells apart ops of one name in a block (a transformer's
    up and down projections), and is the
    same when the checkpoint runs the op again."""
    return f"{name}({', '.join('x'.join(map(str, t.shape)) or '[]' for t in tensors)})"
