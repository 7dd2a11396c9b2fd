"""A CUDA step simulated on CPU fake tensors runs the kernels a CUDA device would run, where they change memory.

NOTE [A CUDA step simulated on CPU]
Fake tensors on a "cuda" device cannot take part in autograd in a CPU-only build of torch, so
a `device="cuda"` prediction without a GPU runs its step on CPU fake tensors.  Where the kernels
of the two devices differ in what the step holds, the choice is made here as CUDA makes it:

Rule 1 (optimizer).  Adam(W) and friends run their multi-tensor (foreach) kernels on CUDA when
    the user left the choice to torch (`fake.multi_tensor_as_on_cuda`).
Rule 2 (autocast).  `torch.autocast("cuda", dtype)` in the user's code would be disabled on a
    machine with no CUDA.  For the step it enters CPU autocast with the same dtype instead
    (float16 when none is given, CUDA's default), which casts the same matmul / convolution /
    linear / attention inputs down, and this mode adds CUDA's float32 list on top (softmax,
    log_softmax, layer_norm, group_norm, exp, log, pow, sum, cumsum, the losses, interpolate:
    inputs cast up to float32, or the output dtype set to float32 where the op takes one).  The
    casts are made before autograd records the op, as autocast makes them, so what backward
    saves has CUDA's dtypes.  The float32 list is applied where user code calls those ops
    through torch's Python API (module forwards do); an op called from inside another torch
    function (say, a softmax inside `F.multi_head_attention_forward`) keeps CPU autocast's
    choice.
Rule 3 (attention).  `F.scaled_dot_product_attention` runs the kernel an sm80-or-newer GPU picks
    with torch's default priority (flash, then memory-efficient, then math; `cuda_backend` states
    each kernel's conditions).  The choice matters: CPU runs attention with dropout as the math
    path, which saves the (L, L) probabilities and dropout mask that a fused CUDA kernel never
    holds.  Grouped-query calls (`enable_gqa` with fewer key heads) run flash with the key and value
    at their own head count where flash can run them, as CUDA does (H100, torch 2.11: K/V saved at 4
    heads for 16 query heads), else the math path, which repeats them to the query's heads.  GPUs
    whose torch build prefers cuDNN attention (H100 with a recent cuDNN) save the same output and
    log-sum-exp as flash.  A mask whose last dimension is not dense (stride != 1) rules out both
    fused kernels on a GPU, though not on CPU: T5's relative position bias, a permuted (1, H, L, L)
    view with stride H there, made an H200 (torch 2.11) run T5's self-attention as the math path,
    868 MiB more than the memory-efficient kernel at batch 8 x 512 (2026-11-27).
Rule 4 (backward).  Checkpoints recompute their forward inside backward, which must run the same
    kernels as the forward did (or torch raises CheckpointError).  Torch takes a torch-function
    mode off its stack while it handles a call, `loss.backward()` included, so the mode puts
    itself back for the autograd engine's run (`backward_in_mode`).  `torch.autograd.grad`
    called by the user's loss function is not covered.
Rule 5 (saved as CUDA saves).  Three ops save other tensors on CUDA than on CPU, and run as on CUDA:
    dropout (`F.dropout`, `nn.Dropout`) is CUDA's fused `native_dropout`, which saves its mask as bool
    (one byte an element; CPU saves a mask of the input's dtype, 4 bytes for float32: a dropout MLP
    was predicted 25% high on an H100); `F.rms_norm` is CUDA's fused `_fused_rms_norm`, which saves
    the input and one float32 statistic per row (CPU's composite saves every intermediate).  A layer norm of a
    float16 or bfloat16 input keeps its mean and inverse deviation per row in float32 on CUDA, where CPU's
    kernel keeps them in the input's dtype (H100, torch 2.11: 64 KiB saved for 8192 bfloat16 rows, 32 KiB
    simulated before; `tests/test_cuda_simulation.py`): the fake kernel's outputs are taken so (`fake_ops.
    cuda_statistics`, NOTE [A meta kernel stricter than its kernel], Rule 4).  Under autocast CUDA runs layer_norm in
    float32 (Rule 2): that concerns a model cast to the half dtype.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
from collections import Counter
from collections.abc import Iterator

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from remat._torch_compat import backward_in_mode, cuda_autocast_runs_on_cpu
from remat._torch_compat.fake_ops import cuda_statistics

FLOAT32_OPS = frozenset(  # CUDA autocast's float32 list, by Python name: inputs cast up to float32
    {
        "acos",
        "asin",
        "cosh",
        "erfinv",
        "exp",
        "expm1",
        "log",
        "log10",
        "log2",
        "log1p",
        "reciprocal",
        "rsqrt",
        "sinh",
        "tan",
        "pow",
        "__pow__",
        "__rpow__",
        "softplus",
        "layer_norm",
        "group_norm",
        "cosine_similarity",
        "poisson_nll_loss",
        "cosine_embedding_loss",
        "nll_loss",
        "hinge_embedding_loss",
        "kl_div",
        "l1_loss",
        "smooth_l1_loss",
        "huber_loss",
        "mse_loss",
        "margin_ranking_loss",
        "multilabel_margin_loss",
        "soft_margin_loss",
        "triplet_margin_loss",
        "multi_margin_loss",
        "binary_cross_entropy_with_logits",
        "dist",
        "pdist",
        "cdist",
        "renorm",
        "logsumexp",
        "interpolate",
        "cross_entropy",  # log_softmax and nll_loss inside, both on the list
    }
)
FLOAT32_OUTPUT_OPS = frozenset(  # ops with a dtype argument: CUDA autocast sets it to float32
    {"softmax", "log_softmax", "cumsum", "cumprod", "prod", "sum", "norm", "vector_norm", "matrix_norm"}
)
LOWER = (torch.float16, torch.bfloat16)


class CudaKernels(TorchFunctionMode):
    """NOTE [A CUDA step simulated on CPU], Rules 2 to 4, for the length of a simulated step."""

    def __init__(self) -> None:
        super().__init__()
        self.attention: Counter[str] = Counter()
        """How many attention calls ran each kernel ("flash", "efficient", "math", or "cpu": grouped-query)."""
        self.autocast_dtypes: set[torch.dtype] = set()

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.Tensor.backward or func is torch.autograd.backward:  # checkpoints recompute in there
            return backward_in_mode(self, func, args, kwargs)
        if func is F.scaled_dot_product_attention:
            return self._attention(*args, **kwargs)
        if func in (F.dropout, torch.dropout) and torch.is_grad_enabled():
            return _dropout(*args, **kwargs)
        if func in (F.rms_norm, torch.rms_norm) and torch.is_grad_enabled():
            return _rms_norm(*args, **kwargs)
        if not torch.is_autocast_enabled("cpu"):
            return func(*args, **kwargs)
        self.autocast_dtypes.add(torch.get_autocast_dtype("cpu"))
        name = getattr(func, "__name__", "")
        if name in FLOAT32_OPS:
            return func(*_up(args), **{k: _up_one(v) for k, v in kwargs.items()})
        if name in FLOAT32_OUTPUT_OPS and args and _lower(args[0]) and kwargs.get("dtype") is None:
            return func(*args, **{**kwargs, "dtype": torch.float32})
        return func(*args, **kwargs)

    def _attention(self, *args, **kwargs):
        call = Attention(*args, **kwargs)
        if torch.is_autocast_enabled("cpu"):  # attention is on the lower-precision list (cast before choosing)
            low = torch.get_autocast_dtype("cpu")
            call.query, call.key, call.value, call.attn_mask = (
                _down(t, low) for t in (call.query, call.key, call.value, call.attn_mask)
            )
        kernel = cuda_backend(call.query, call.key, call.value, call.attn_mask, call.is_causal, call.enable_gqa)
        self.attention[kernel] += 1
        with torch.autocast("cpu", enabled=False):
            if kernel == "flash":
                return _flash(call)
            if kernel == "efficient":
                return _efficient(call)
            if kernel == "math":
                return _math(call)
            return F.scaled_dot_product_attention(**{f.name: getattr(call, f.name) for f in dataclasses.fields(call)})

    def notes(self) -> list[str]:
        """What the profile says about the kernels simulated (nothing when no attention or autocast ran)."""
        out = []
        simulated = sorted(self.attention)
        if simulated:
            out.append(f"attention run with the kernel an sm80+ GPU picks for each call: {', '.join(simulated)}.")
        if self.autocast_dtypes:
            dtypes = ", ".join(sorted(str(d).removeprefix("torch.") for d in self.autocast_dtypes))
            out.append(
                f"autocast('cuda', {dtypes}) simulated: CPU autocast's casts plus CUDA's float32 ops "
                "(softmax, layer_norm, losses, ...)."
            )
        return out


@contextlib.contextmanager
def as_on_cuda() -> Iterator[CudaKernels]:
    """The step inside runs autocast and attention as a CUDA device would (yields the mode, for its notes)."""
    kernels = CudaKernels()
    with cuda_autocast_runs_on_cpu(), cuda_statistics(), kernels:
        yield kernels


def cuda_backend(query, key, value, attn_mask, is_causal: bool, enable_gqa: bool) -> str:
    """The attention kernel an sm80-or-newer GPU runs for these arguments with torch's default priority:
    "flash", "efficient" or "math" (grouped-query attention: flash, else math)."""
    if not all(t.dim() == 4 for t in (query, key, value)) or 0 in (*query.shape, *key.shape):
        return "math"
    if query.size(1) != key.size(1) or key.size(1) != value.size(1):
        grouped = enable_gqa and key.size(1) == value.size(1) and query.size(1) % key.size(1) == 0
        return "flash" if grouped and _flash_ok(query, key, value, attn_mask, is_causal) else "math"
    if _flash_ok(query, key, value, attn_mask, is_causal):
        return "flash"
    if _efficient_ok(query, key, value) and (attn_mask is None or attn_mask.stride(-1) == 1):
        return "efficient"
    return "math"


def _flash_ok(query, key, value, attn_mask, is_causal: bool) -> bool:
    """Flash attention: float16/bfloat16, no mask, one head size <= 256, causal only on a square."""
    same_head = query.size(-1) == key.size(-1) == value.size(-1) <= 256
    square = not is_causal or query.size(-2) == key.size(-2)
    dense_rows = all(t.stride(-1) == 1 or t.size(-1) == 1 for t in (query, key, value))
    return attn_mask is None and query.dtype in LOWER and same_head and square and dense_rows


def _efficient_ok(query, key, value) -> bool:
    """Memory-efficient attention: float32/16/bfloat16, head sizes and offsets aligned to the GEMM's
    minimum (8 elements at 16 bits, 4 at 32)."""
    if query.dtype not in (*LOWER, torch.float32):
        return False
    align = 8 if query.dtype in LOWER else 4
    heads = query.size(-1) == key.size(-1) and query.size(-1) % align == 0 and value.size(-1) % align == 0
    offsets = all(t.storage_offset() % align == 0 for t in (query, key, value))
    return heads and offsets and all(t.stride(-1) == 1 for t in (query, key, value))


@dataclasses.dataclass
class Attention:
    """The arguments of one `F.scaled_dot_product_attention` call, as torch names them."""

    query: torch.Tensor
    key: torch.Tensor
    value: torch.Tensor
    attn_mask: torch.Tensor | None = None
    dropout_p: float = 0.0
    is_causal: bool = False
    scale: float | None = None
    enable_gqa: bool = False


def _flash(call: Attention):
    """As torch runs flash attention: heads padded to a multiple of 8, the scale of the unpadded size."""
    query, key, value = call.query, call.key, call.value
    head = query.size(-1)
    scale = call.scale if call.scale is not None else 1.0 / math.sqrt(head)
    pad = -head % 8
    if pad:
        query, key, value = (F.pad(t, (0, pad)) for t in (query, key, value))
    out = torch.ops.aten._scaled_dot_product_flash_attention(
        query, key, value, call.dropout_p, call.is_causal, scale=scale
    )[0]
    return out[..., :head] if pad else out


def _efficient(call: Attention):
    """As torch runs memory-efficient attention: a boolean mask made an additive bias of the query's dtype,
    its last dimension padded to a multiple of 16, broadcast to (B, H, L, S)."""
    query, key, value, bias = call.query, call.key, call.value, call.attn_mask
    if bias is not None:
        if bias.dtype == torch.bool:
            inf = torch.tensor(-math.inf, dtype=query.dtype)
            bias = torch.where(bias.logical_not(), inf, torch.zeros((), dtype=query.dtype))
        length = bias.size(-1)
        if length % 16:
            bias = F.pad(bias, (0, -length % 16))[..., :length]
        shape = (query.size(0), query.size(1), query.size(2), key.size(2))
        bias = bias.expand(shape)
    needs_lse = torch.is_grad_enabled() and any(t.requires_grad for t in (query, key, value))
    return torch.ops.aten._scaled_dot_product_efficient_attention(
        query, key, value, bias, needs_lse, call.dropout_p, call.is_causal, scale=call.scale
    )[0]


def _math(call: Attention):
    """As torch runs the math path on CUDA (`_scaled_dot_product_attention_math`): q and k each scaled by the
    square root of the scale, a causal or boolean mask made additive, key and value repeated to the query's
    heads for grouped-query calls, a safe softmax, then dropout as CUDA's fused `native_dropout` (its mask saved
    as bool; on CPU the same aten op would save a float mask, Rule 5)."""
    if not call.dropout_p:
        return torch.ops.aten._scaled_dot_product_attention_math(
            call.query,
            call.key,
            call.value,
            call.attn_mask,
            0.0,
            call.is_causal,
            scale=call.scale,
            enable_gqa=call.enable_gqa,
        )[0]
    query, key, value, mask = call.query, call.key, call.value, call.attn_mask
    root = math.sqrt(call.scale if call.scale is not None else 1.0 / math.sqrt(query.size(-1)))
    if call.is_causal:
        mask = torch.ones(query.size(-2), key.size(-2), dtype=torch.bool, device=query.device).tril()
    if mask is not None and mask.dtype == torch.bool:
        mask = torch.zeros((), dtype=query.dtype, device=query.device).masked_fill(mask.logical_not(), -math.inf)
    if call.enable_gqa and key.size(-3) != query.size(-3):
        repeat = query.size(-3) // key.size(-3)
        key, value = key.repeat_interleave(repeat, dim=-3), value.repeat_interleave(repeat, dim=-3)
    attn = (query * root) @ (key.transpose(-2, -1) * root)
    if mask is not None:
        attn = attn + mask
    attn = torch.ops.aten._safe_softmax(attn, -1)
    attn = torch.ops.aten.native_dropout(attn, call.dropout_p, True)[0]
    return attn @ value


def _dropout(input, p: float = 0.5, training: bool = True, inplace: bool = False, *, train: bool | None = None):
    """Rule 5: CUDA's fused dropout, its mask saved as bool (`inplace` too: CUDA's in-place dropout saves the
    same mask); `F.dropout`'s arguments, or `torch.dropout(input, p, train)`'s."""
    training = training if train is None else train
    if not training or p == 0:
        return input
    out = torch.ops.aten.native_dropout(input, p, True)[0]
    return input.copy_(out) if inplace else out


def _rms_norm(input, normalized_shape, weight=None, eps=None):
    """Rule 5: CUDA's fused RMS norm (input and a float32 statistic per row saved)."""
    return _FusedRmsNorm.apply(input, weight, list(normalized_shape))


class _FusedRmsNorm(torch.autograd.Function):
    """Rule 5: what CUDA's `_fused_rms_norm` allocates and saves, on fake tensors (the step is fake, so values do
    not matter; CPU has no fused kernel and would decompose it, saving every intermediate)."""

    @staticmethod
    def forward(ctx, input, weight, normalized_shape):
        rows = (*input.shape[: input.dim() - len(normalized_shape)], *([1] * len(normalized_shape)))
        rstd = input.new_empty(rows, dtype=torch.float32)  # (..., 1): one statistic per row
        out = input * rstd.to(input.dtype)
        if weight is not None:
            out.mul_(weight)
        ctx.save_for_backward(input, rstd, weight)
        ctx.normalized_shape = normalized_shape
        return out

    @staticmethod
    def backward(ctx, grad):
        input, rstd, weight = ctx.saved_tensors
        mask = [ctx.needs_input_grad[0], weight is not None and ctx.needs_input_grad[1]]
        grad_input, grad_weight = torch.ops.aten._fused_rms_norm_backward(
            grad, input, ctx.normalized_shape, rstd, weight, mask
        )
        return grad_input, grad_weight, None


def _lower(t) -> bool:
    return isinstance(t, torch.Tensor) and t.dtype in LOWER


def _up_one(t):
    return t.float() if _lower(t) else t


def _up(args: tuple) -> tuple:
    return tuple(_up_one(a) for a in args)


def _down(t, dtype: torch.dtype):
    """Autocast's lower-precision cast: floating tensors other than float64 go to `dtype`."""
    if isinstance(t, torch.Tensor) and t.is_floating_point() and t.dtype not in (dtype, torch.float64):
        return t.to(dtype)
    return t
