"""TARGETs the process-measure tests run in a fresh interpreter (`remat.verifier.process`)."""

from remat import zoo


def chain():
    """Report 001's chain, 16 blocks of 256 at batch 8192: a ~270 MiB step made mostly of activations."""
    return zoo.chain_report001(width=256, blocks=16, batch=8192)
