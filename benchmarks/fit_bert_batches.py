"""BERT-base (fp32, AdamW, 512 tokens) on a 12 GiB GPU: the largest batch that fits as is, with PyTorch's fused
attention (sdpa, the default) and with the attention written out (eager)."""

from remat.fit import will_it_fit
from remat.fit.build import load_config

for impl in ("sdpa", "eager"):
    for batch in (6, 8, 10, 12, 16, 20, 24):
        config, _ = load_config("docs/configs/bert-base")
        config._attn_implementation = impl
        answer = will_it_fit(config, "12GiB", seq=512, batch=batch, dtype="fp32", changes=())
        reserve = answer.profile.gpu_reserve
        print(
            f"{impl:5}  batch {batch:2}  reserves {reserve.reserved_bytes / 2**30:5.2f} GiB "
            f"({reserve.expandable_reserved_bytes / 2**30:5.2f} with expandable segments): {answer.outcome.verdict}"
        )
