"""TARGETs the process-measure tests run in a fresh interpreter (`remat.verifier.process`)."""

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
