"""The least-memory plan's tensors of a config's fake step, with its stacks cut to each depth asked for: is it
linear in the layers, as NOTE [A deep model from two shallow ones] needs it to be (src/remat/fit/estimate.py)?

    python benchmarks/fit_depths.py docs/configs/t5-base --seq 1024 --batch 8 --world-size 8 --depths 1,2,3,12

prints, for each depth, the unplanned step's peak, the least plan's tensors, and what copies with the first two
depths extrapolate to it."""

from __future__ import annotations

import argparse

from remat.fit.build import head_of, load_config
from remat.fit.depth import stacks_of, with_layers
from remat.fit.setup import Setup, check_setup, parse_gpu
from remat.fit.step import least_tensors, profile_step


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("config")
    p.add_argument("--seq", type=int, default=1024)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--dtype", default="bf16")
    p.add_argument("--world-size", type=int, default=1)
    p.add_argument("--gpu", default="H100")
    p.add_argument(
        "--depths", default="1,2,3", help="layers in each stack, comma-separated (the first two extrapolate)"
    )
    args = p.parse_args()
    config, _ = load_config(args.config)
    head, _ = head_of(config)
    setup = check_setup(Setup(seq=args.seq, batch=args.batch, dtype=args.dtype, world_size=args.world_size))
    gpu, depths = parse_gpu(args.gpu, None), [int(d) for d in args.depths.split(",")]
    print(
        f"{args.config}: stacks {stacks_of(config)}, {args.batch} x {args.seq} tokens, {args.dtype}, "
        f"{setup.world_size} rank(s)"
    )
    least: list[float] = []
    for depth in depths:
        _, prof = profile_step(with_layers(config, depth), head, setup, gpu)
        least.append(least_tensors(prof) / 2**30)
        line = f"  {depth:3} layers: unplanned peak {prof.peak_bytes / 2**30:6.3f} GiB, least plan {least[-1]:6.3f} GiB"
        if len(least) > 2:
            slope = (least[1] - least[0]) / (depths[1] - depths[0])
            line += (
                f", extrapolated from {depths[0]} and {depths[1]}: {least[0] + (depth - depths[0]) * slope:6.3f} GiB"
            )
        print(line)


if __name__ == "__main__":
    main()
