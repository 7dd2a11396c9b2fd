"""TARGETs the process-measure tests run in a fresh interpreter (`remat.verifier.process`)."""

from remat import zoo


def chain():
    """Report 001's chain at 16 blocks of 1024, batch 1024: a ~300 MiB step whose activations matter."""
    return zoo.chain_report001(width=1024, blocks=16, batch=1024)
