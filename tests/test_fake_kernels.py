"""A fake step runs the kernels the real step runs: a CUDA step simulated on CPU runs autocast and attention
as CUDA does (NOTE [A CUDA step simulated on CPU]); a Hugging Face decoder gets the mask the real inputs give
(NOTE [Packed sequences under fake tensors])."""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import remat
from remat import zoo
from remat.measure.device.cuda_kernels import cuda_backend

B, H, L, D = 2, 4, 256, 64  # batch, heads, sequence, head size: a (B, H, L, L) float32 matrix is 2 MiB


class Attention(nn.Module):
    """(B, L, H*D) -> (B, L, H*D), causal self-attention through F.scaled_dot_product_attention."""

    def __init__(self, dropout: float = 0.0):
        super().__init__()
        self.qkv = nn.Linear(H * D, 3 * H * D)
        self.out = nn.Linear(H * D, H * D)
        self.dropout = dropout

    def forward(self, x):
        q, k, v = self.qkv(x).view(B, L, 3, H, D).permute(2, 0, 3, 1, 4)  # 3 x (B, H, L, D)
        y = F.scaled_dot_product_attention(q, k, v, dropout_p=self.dropout, is_causal=True)
        return self.out(y.transpose(1, 2).reshape(B, L, H * D))


class Scores(nn.Module):
    """Attention written out: softmax(q k^T) v, the softmax on CUDA autocast's float32 list."""

    def __init__(self):
        super().__init__()
        self.q, self.k, self.v = (nn.Linear(H * D, H * D) for _ in range(3))

    def forward(self, x):
        p = (self.q(x) @ self.k(x).transpose(-1, -2)).softmax(-1)  # (B, L, L)
        return p @ self.v(x)


class Autocast(nn.Module):
    """`model` run under torch.autocast(device, bfloat16), as a user's training step writes it."""

    def __init__(self, model: nn.Module, device: str):
        super().__init__()
        self.model, self.device = model, device

    def forward(self, x):
        with torch.autocast(self.device, dtype=torch.bfloat16):
            return self.model(x)


def _x():
    torch.manual_seed(0)
    return torch.randn(B, L, H * D)


def _saved(prof) -> dict[str, int]:
    return {b.name: b.saved_bytes for b in prof.blocks}


def _meta(*shape, dtype=torch.bfloat16):
    return torch.empty(shape, dtype=dtype, device="meta")


@pytest.mark.parametrize(
    "q, k, mask, causal, gqa, kernel",
    [
        (_meta(B, H, L, D), _meta(B, H, L, D), None, True, False, "flash"),
        (
            _meta(B, H, L, D, dtype=torch.float32),
            _meta(B, H, L, D, dtype=torch.float32),
            None,
            True,
            False,
            "efficient",
        ),  # flash takes 16-bit inputs only
        (_meta(B, H, L, D), _meta(B, H, L, D), _meta(L, L, dtype=torch.bool), False, False, "efficient"),
        (_meta(B, H, L, 6), _meta(B, H, L, 6), None, False, False, "flash"),  # padded to 8 by torch
        (
            _meta(B, H, L, 6, dtype=torch.float32),
            _meta(B, H, L, 6, dtype=torch.float32),
            None,
            False,
            False,
            "math",
        ),  # 6 is not a multiple of the 4 float32 elements the memory-efficient GEMM needs
        (_meta(B, H, L // 2, D), _meta(B, H, L, D), None, True, False, "efficient"),  # causal, not square
        (_meta(B, H, L, D, dtype=torch.float64), _meta(B, H, L, D, dtype=torch.float64), None, False, False, "math"),
        (_meta(B * H, L, D), _meta(B * H, L, D), None, False, False, "math"),  # 3-d inputs
        (_meta(B, H, L, D), _meta(B, 1, L, D), None, True, True, "flash"),  # grouped-query: K/V at their own heads
        (
            _meta(B, H, L, D, dtype=torch.float32),
            _meta(B, 1, L, D, dtype=torch.float32),
            None,
            True,
            True,
            "math",
        ),  # grouped-query in float32: flash cannot, the math path repeats K/V to the query's heads
    ],
)
def test_the_attention_kernel_is_the_one_an_sm80_gpu_picks(q, k, mask, causal, gqa, kernel):
    assert cuda_backend(q, k, k, mask, causal, gqa) == kernel


def test_simulated_cuda_attention_with_dropout_saves_no_sequence_by_sequence_matrix():
    model = nn.Sequential(Attention(dropout=0.1))
    cpu = _saved(remat.profile(model, _x(), mode="fake"))["0"]
    prof = remat.profile(model, _x(), mode="fake", device="cuda")
    cuda = _saved(prof)["0"]
    probabilities = B * H * L * L * 4
    # CPU runs dropout attention as the math path: the probabilities and the dropped-out copy are saved
    assert cpu - cuda >= 2 * probabilities
    # memory-efficient attention keeps the q, k, v projection, its output (B, L, H, D-ordered: the reshape
    # for self.out is a view), the float32 log-sum-exp and the dropout RNG's seed and offset (512 B blocks)
    act = B * L * H * D * 4
    assert cuda == 3 * act + act + B * H * L * 4 + 2 * 512
    assert "attention run with the kernel an sm80+ GPU picks for each call: efficient." in prof.notes


def test_autocast_cuda_is_honoured_in_a_simulated_cuda_step():
    mlp = nn.Sequential(nn.Linear(H * D, 1024), nn.GELU(), nn.Linear(1024, H * D))
    cuda = remat.profile(Autocast(mlp, "cuda"), _x(), mode="fake", device="cuda")
    cpu = remat.profile(Autocast(mlp, "cpu"), _x(), mode="fake")
    fp32 = remat.profile(mlp, _x(), mode="fake", device="cuda")
    # linear and GELU are cast alike by CPU and CUDA autocast; every size here is a multiple of 512 bytes
    assert _saved(cuda) == _saved(cpu) == {"model.0": 1310720, "model.1": 1048576, "model.2": 524288}
    outputs = {b.name: b.output_bytes for b in cuda.blocks}
    assert outputs["model.0"] == B * L * 1024 * 2  # bfloat16, where autocast disabled would give float32:
    assert {b.name: b.output_bytes for b in fp32.blocks}["0"] == B * L * 1024 * 4
    assert any("autocast('cuda', bfloat16) simulated" in n for n in cuda.notes)


def test_the_softmax_runs_in_float32_under_simulated_cuda_autocast():
    cuda = _saved(remat.profile(Autocast(Scores(), "cuda"), _x(), mode="fake", device="cuda"))["model"]
    cpu = _saved(remat.profile(Autocast(Scores(), "cpu"), _x(), mode="fake"))["model"]
    # CUDA keeps the probabilities in float32 for the softmax's backward, and a bfloat16 copy for the matmul;
    # CPU autocast keeps one bfloat16 tensor for both
    assert cuda - cpu == B * L * L * 4


def test_plans_for_a_simulated_cuda_step_hold_when_their_checkpoints_recompute():
    model = Autocast(nn.Sequential(Attention(dropout=0.1), nn.GELU(), Attention(dropout=0.1)), "cuda")
    prof = remat.profile(model, _x(), mode="fake", device="cuda")
    by_flops = remat.frontier(dataclasses.replace(prof, timing=""))  # more points than the seconds' frontier
    assert len(by_flops) >= 3
    for plan in (
        remat.frontier(prof) + by_flops
    ):  # recomputation in backward runs the same CUDA kernels, or torch raises CheckpointError
        remat.apply(model, plan)
        try:
            assert remat.profile(model, _x(), mode="fake", device="cuda").peak_bytes == plan.peak_bytes
        finally:
            remat.remove(model)


def test_a_fake_hugging_face_step_gets_the_mask_the_real_inputs_give():
    model, inputs = zoo.gpt2(n_layer=2, seq=128, batch=4, n_embd=128, vocab=512)
    remat.apply(model, remat.frontier(remat.profile(model, inputs, mode="fake"))[-1])
    real = remat.profile(model, inputs)
    # before: fake tensors made Hugging Face build a causal mask (it cannot read position_ids) that the
    # real step never builds, 64 KiB over in this planned step
    assert remat.profile(model, inputs, mode="fake").peak_bytes == real.peak_bytes


def test_packed_position_ids_keep_their_mask_in_a_fake_step():
    model, inputs = zoo.gpt2(n_layer=2, seq=128, batch=4, n_embd=128, vocab=512)
    inputs["position_ids"] = torch.cat([torch.arange(64), torch.arange(64)]).expand(4, -1)  # two per row
    fake = remat.profile(model, inputs, mode="fake")
    assert fake.peak_bytes == remat.profile(model, inputs).peak_bytes
    assert any("pack several sequences per row" in n for n in fake.notes)


@pytest.mark.parametrize("padded", [False, True])
@pytest.mark.parametrize("arch", ["llama", "bart"])
def test_a_tokenizers_attention_mask_is_read_in_a_fake_step_as_in_the_real_one(arch, padded):
    """NOTE [A mask Hugging Face reads, under fake tensors]: an all-ones mask makes no (B, 1, L, L) mask in the
    real step, and Hugging Face took a fake one for a traced graph and built it (Llama +73,728 bytes here, BART
    +49,152: a fake step over its real one); a mask with padding makes one in both."""
    pytest.importorskip("transformers")
    import architectures

    model, inputs = getattr(architectures, arch)()
    inputs["attention_mask"] = torch.ones_like(inputs["input_ids"])
    if padded:
        inputs["attention_mask"][1, 24:] = 0
    fake = remat.profile(model, inputs, mode="fake")
    assert fake.peak_bytes == remat.profile(model, inputs).peak_bytes
    unmasked = remat.profile(model, {k: v for k, v in inputs.items() if k != "attention_mask"}, mode="fake")
    assert (fake.peak_bytes - unmasked.peak_bytes > 4096) is padded  # the mask's input is 512 bytes


def test_a_float32_mixture_of_experts_profiles_in_fake_mode_at_its_real_peak():
    """transformers 5's experts run one grouped matmul (`aten._grouped_mm`), whose meta kernel refuses float32 where
    the kernels run it: the fake step raised "Expected inputs of BF16 type" (NOTE [A meta kernel stricter than its
    kernel]).  Outside remat's fake step torch's own meta kernel still decides."""
    pytest.importorskip("transformers")
    from architectures import moe

    model, inputs = moe()
    real = remat.profile(model, inputs)
    fake = remat.profile(model, inputs, mode="fake")
    assert fake.peak_bytes == real.peak_bytes
    assert [b.forward_flops for b in fake.blocks] == [b.forward_flops for b in real.blocks]
    from remat._torch_compat import FakeTensorMode

    a, b, offs = torch.randn(8, 16), torch.randn(2, 16, 4), torch.tensor([3, 8], dtype=torch.int32)
    assert torch._grouped_mm(a, b, offs=offs).shape == (8, 4)  # the CPU kernel runs float32
    with FakeTensorMode(allow_non_fake_inputs=True), pytest.raises(RuntimeError, match="BF16"):
        torch._grouped_mm(a, b, offs=offs)


class NormThenTranspose(nn.Module):
    """A LayerNorm whose output is read transposed (Swin's windows): its incoming gradient is not contiguous, and
    its input is a view that merges dimensions in backward, which works on a contiguous gradient only."""

    def __init__(self, batch: int, length: int, width: int):
        super().__init__()
        self.shape = (batch, length, width)
        self.fc = nn.Linear(width, width)
        self.norm = nn.LayerNorm(width)
        self.w = nn.Parameter(torch.randn(width, length))

    def forward(self, x):  # (batch * length, width)
        y = self.norm(self.fc(x).view(self.shape))
        return (y.transpose(1, 2) * self.w).sum()


def test_a_layer_norm_gradient_is_laid_out_in_a_fake_step_as_its_kernel_lays_it_out():
    """torch's meta kernel lays out LayerNorm's input gradient like the incoming one; the kernels make it contiguous,
    so the real step's backward views it where the fake step copied it (Swin: +8,192 bytes; NOTE [A meta kernel
    stricter than its kernel], Rule 3).  The fake step's live bytes now equal the real step's after every op."""
    batch, length, width = 8, 256, 64
    torch.manual_seed(0)
    model, x = NormThenTranspose(batch, length, width), torch.randn(batch * length, width)
    real = remat.profile(model, (x,), loss_fn=lambda out: out)
    fake = remat.profile(model, (x,), mode="fake", loss_fn=lambda out: out)
    assert fake.timeline.live_bytes == real.timeline.live_bytes
    assert fake.peak_bytes == real.peak_bytes

    y = torch.randn(batch, length, width)
    out, mean, rstd = torch.ops.aten.native_layer_norm(y, [width], model.norm.weight, model.norm.bias, 1e-5)
    grad = torch.randn(batch, width, length).transpose(1, 2)
    dx, _, _ = torch.ops.aten.native_layer_norm_backward(
        grad, y, [width], mean, rstd, model.norm.weight, model.norm.bias, [True, True, True]
    )
    assert not grad.is_contiguous() and dx.is_contiguous()  # the fact the rule copies from the kernel


class Norms(nn.Module):
    """A convolution, then a batch norm, a group norm and a layer norm, under CPU bf16 autocast: each gets the
    convolution's bfloat16 output with its float32 weights (autocast casts none of them on CPU)."""

    def __init__(self, channels: int = 16, side: int = 32):
        super().__init__()
        self.conv = nn.Conv2d(3, channels, 3, padding=1)
        self.batch, self.group = nn.BatchNorm2d(channels), nn.GroupNorm(4, channels)
        self.layer = nn.LayerNorm(side)

    def forward(self, x):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return self.layer(self.group(self.batch(self.conv(x)))).float().sum()


def test_a_norm_of_a_half_input_with_float32_weights_keeps_float32_statistics_in_a_fake_step():
    """CPU's mixed-type norm kernels return their statistics in float32, torch's meta kernels in the input's dtype:
    under bf16 autocast RoBERTa's fake peak was 256 bytes under its real one, wav2vec2's 19,408 (NOTE [A meta
    kernel stricter than its kernel], Rule 4).  Here the fake step was 16,576 bytes under the real one from the batch
    norm on; now its forward's live bytes equal the real step's after every op, and so does its peak (in backward the
    group norm's fake gradient runs torch's decomposition, one op more, above the kernel, not below)."""
    torch.manual_seed(0)
    model, x = Norms(), torch.randn(8, 3, 32, 32)
    real = remat.profile(model, (x,), loss_fn=lambda out: out)
    fake = remat.profile(model, (x,), mode="fake", loss_fn=lambda out: out)
    forward = real.timeline.phases.index("backward")
    assert fake.timeline.live_bytes[:forward] == real.timeline.live_bytes[:forward]
    assert fake.peak_bytes == real.peak_bytes
    _, mean, rstd = torch.ops.aten.native_layer_norm(x.bfloat16(), [32], model.layer.weight, model.layer.bias, 1e-5)
    assert mean.dtype == rstd.dtype == torch.float32  # the kernel's fact the rule copies
