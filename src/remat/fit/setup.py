"""What `remat fit` is asked: the training setup (tokens, precision, LoRA, ranks) and the GPU, read and checked.

NOTE [A GPU's memory, named]
  Rule 1. `--gpu` is a size ("24GiB", "80GB": binary or decimal units, as budgets are read) or a name in GPUS.
          A name's memory is the total the driver reports for that card (nvidia-smi's "MiB" column; what
          `torch.cuda.get_device_properties(0).total_memory` says), from published listings, not measured here:
          an "80 GB" H100 is 81,559 MiB, a "24 GB" RTX 4090 24,564 MiB.
  Rule 2. The CUDA context (the driver's and the kernels' own memory, a few hundred MiB) lies outside what
          torch's caching allocator reserves, and is not counted: the 4% margin a GPU budget keeps
          (NOTE [A plan fits the GPU's reserve]) is all the room left for it.  On a card that also drives a
          display, pass the free memory as a size instead.
  Rule 3. Seconds are predicted by a roofline remat knows (`remat.measure.device.roofline`): the GPU's own where it
          has one, else the known GPU whose ratio of bf16 FLOP/s to bandwidth is nearest (an RTX 4090's
          165 TFLOP/s over 1.0 TB/s is nearest an A100's 312 over 2.0); `--hardware` picks another.  Only the
          plan's overhead in percent is printed, which depends on that ratio more than on the rates.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import torch

from remat.errors import RematError
from remat.measure.device.roofline import DEFAULT_GPU, GPUS
from remat.planner.budget import UNITS


class FitError(RematError):
    """`remat fit` cannot answer as asked: a bad GPU, precision, config or setup."""


MIB = 2**20
_SIZE = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*([kmgt]i?b|b)\s*$", re.IGNORECASE)


@dataclass(frozen=True)
class GpuModel:
    """A GPU `--gpu` can name (Rule 1)."""

    label: str
    memory_bytes: int
    roofline: str


GPUS_BY_NAME: dict[str, GpuModel] = {
    "h100": GpuModel("H100 80GB", 81559 * MIB, "H100"),
    "h200": GpuModel("H200 141GB", 143771 * MIB, "H200"),
    "a100": GpuModel("A100 80GB", 81920 * MIB, "A100"),
    "a100-80gb": GpuModel("A100 80GB", 81920 * MIB, "A100"),
    "a100-40gb": GpuModel("A100 40GB", 40960 * MIB, "A100"),
    "l4": GpuModel("L4 24GB", 23034 * MIB, "L4"),
    "4090": GpuModel("RTX 4090 24GB", 24564 * MIB, "A100"),
    "3090": GpuModel("RTX 3090 24GB", 24576 * MIB, "A100"),
    "a10g": GpuModel("A10G 24GB", 23028 * MIB, "A100"),
    "l40s": GpuModel("L40S 48GB", 46068 * MIB, "L4"),
    "t4": GpuModel("T4 16GB", 15360 * MIB, "A100"),
}
"""Rule 1.  Any case; "NVIDIA", "GeForce", "RTX" and spaces in front are dropped ("RTX 4090" is the 4090)."""
GPU_NAMES = ("H100", "H200", "A100", "A100-40GB", "L4", "L40S", "4090", "3090", "A10G", "T4")


@dataclass(frozen=True)
class Gpu:
    """The GPU a step must fit: its memory and the roofline that predicts its seconds."""

    label: str
    memory_bytes: int
    hardware: str
    note: str = ""


def parse_gpu(text: str, hardware: str | None = None) -> Gpu:
    """`--gpu` (and `--hardware`) read: Rule 1 and Rule 3."""
    raw = str(text).strip()
    key = raw.lower().replace(" ", "")
    for prefix in ("nvidia", "-", "geforce", "-", "rtx", "-"):
        key = key.removeprefix(prefix)
    size = _SIZE.match(raw)
    if key in GPUS_BY_NAME:
        gpu = GPUS_BY_NAME[key]
        chosen = _hardware(hardware) or gpu.roofline
        note = "" if chosen == gpu.label.split()[0] else f"seconds by the {chosen} roofline"
        return Gpu(gpu.label, gpu.memory_bytes, chosen, note)
    if size and float(size.group(1)) > 0:
        memory = int(float(size.group(1)) * UNITS[size.group(2).lower()])
        chosen = _hardware(hardware) or DEFAULT_GPU
        label = f"{memory:,} bytes" if size.group(2).lower() == "b" else raw
        return Gpu(label, memory, chosen, f"seconds by the {chosen} roofline")
    names = ", ".join(GPU_NAMES)
    raise FitError(
        f'remat: --gpu is the GPU\'s memory with a unit ("24GiB", "80GB") or a GPU name ({names}); saw {raw!r}. '
        "Fix: e.g. --gpu 24GiB, --gpu 80GB or --gpu H100."
    )


def _hardware(name: str | None) -> str | None:
    if name is None:
        return None
    for known in GPUS:
        if known.lower() == str(name).lower():
            return known
    raise FitError(
        f"remat: --hardware names the GPU whose roofline predicts the seconds: one of {', '.join(GPUS)}; saw "
        f"{name!r}. Fix: e.g. --hardware A100, or leave it out."
    )


# -- precision ---------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Precision:
    """How the model trains: the dtype its weights (and so gradients and AdamW state) are in, and autocast's."""

    weights: torch.dtype
    autocast: torch.dtype | None
    words: str


DTYPES: dict[str, Precision] = {
    "bf16": Precision(torch.bfloat16, None, "weights, gradients and AdamW state in bf16"),
    "fp16": Precision(torch.float16, None, "weights, gradients and AdamW state in fp16"),
    "fp32": Precision(torch.float32, None, "weights, gradients and AdamW state in fp32"),
    "amp-bf16": Precision(
        torch.float32,
        torch.bfloat16,
        "fp32 weights, gradients and AdamW state, forward under bf16 autocast (mixed precision)",
    ),
    "amp-fp16": Precision(
        torch.float32,
        torch.float16,
        "fp32 weights, gradients and AdamW state, forward under fp16 autocast (mixed precision)",
    ),
}


OPTIMS = {  # --optim, by the names of Hugging Face's TrainingArguments.optim -> the answer's words
    "adamw_torch_fused": "fused AdamW",
    "adamw_torch": "AdamW (foreach kernels)",
}
DEFAULT_OPTIM = "adamw_torch_fused"
"""The Trainer's default optimizer with torch 2.8 or newer: torch's AdamW(fused=True), which updates each tensor in
place; "adamw_torch" is AdamW as torch picks it for CUDA (foreach), a plain training loop's."""


DEFAULT_SEQ = 2048
"""`--seq` where it is not given (a text model's tokens per sequence)."""


@dataclass(frozen=True)
class Setup:
    """One training step to fit: `batch` sequences of `seq` tokens (a multiple choice model: `batch` rows of
    `choices` such sequences; an image classifier: images of `image_size` pixels square, `seq` unused) per GPU, on
    `world_size` GPUs (FSDP2)."""

    seq: int
    batch: int = 1
    dtype: str = "bf16"
    lora: int | None = None
    world_size: int = 1
    optim: str = DEFAULT_OPTIM
    image_size: int | None = None
    choices: int | None = None

    @property
    def precision(self) -> Precision:
        return DTYPES[self.dtype]

    @property
    def fused(self) -> bool:
        """AdamW fused (the Trainer's default), else its foreach kernels."""
        return self.optim == "adamw_torch_fused"

    def trains(self) -> str:
        """What is in which dtype, in words; with LoRA the adapters are fp32 (NOTE [A model from its config],
        Rule 4) and the base's weights frozen, with no gradient or AdamW state."""
        if not self.lora:
            return self.precision.words
        short = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32"}
        autocast = self.precision.autocast
        under = f", forward under {short[autocast]} autocast (mixed precision)" if autocast else ""
        return (
            f"the base's weights in {short[self.precision.weights]}, frozen; the adapters, their gradients and "
            f"AdamW state in fp32{under}"
        )


def check_setup(setup: Setup) -> Setup:
    """A `remat:` error for a setup that cannot be trained as asked."""
    if setup.dtype not in DTYPES:
        raise FitError(
            f"remat: --dtype is the precision the model trains in: one of {', '.join(DTYPES)}; saw {setup.dtype!r}. "
            "Fix: e.g. --dtype bf16 (weights in bf16, as a model loaded with torch_dtype=torch.bfloat16 trains)."
        )
    if setup.optim not in OPTIMS:
        raise FitError(
            f"remat: --optim is the optimizer, by the name Hugging Face's Trainer gives it: one of "
            f"{', '.join(OPTIMS)}; saw {setup.optim!r}. Fix: e.g. --optim {DEFAULT_OPTIM} (the Trainer's default), "
            "or leave it out."
        )
    for flag, value, example in (
        ("--seq", setup.seq, 2048),
        ("--batch", setup.batch, 1),
        ("--world-size", setup.world_size, 8),
        *([("--image-size", setup.image_size, 224)] if setup.image_size is not None else []),
        *([("--choices", setup.choices, 4)] if setup.choices is not None else []),
    ):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise FitError(f"remat: {flag} is a whole number of at least 1; saw {value!r}. Fix: e.g. {flag} {example}.")
    if setup.lora is not None and (isinstance(setup.lora, bool) or not isinstance(setup.lora, int) or setup.lora < 1):
        raise FitError(
            f"remat: --lora is the LoRA rank r, a whole number of at least 1; saw {setup.lora!r}. "
            "Fix: e.g. --lora 16, or leave it out for full fine-tuning."
        )
    return setup
