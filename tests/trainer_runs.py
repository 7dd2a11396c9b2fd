"""Short Hugging Face Trainer runs for tests/test_integrations_*.py: a tiny GPT-2 built from a config (random
weights, nothing downloaded), random token ids as its data, 3 steps on CPU with dropout on and a fixed seed."""

from __future__ import annotations

import torch

VOCAB = 512
SEQ = 128
BATCH = 12  # the unplanned step ~147 MiB: a 60% plan stays above the 64 MiB the process counter resolves


def gpt2(n_layer: int = 4):
    import transformers

    transformers.logging.set_verbosity_error()
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(
        n_layer=n_layer, n_embd=128, n_head=4, n_positions=SEQ, vocab_size=VOCAB, bos_token_id=0, eos_token_id=0
    )  # dropout 0.1 everywhere, as GPT-2's config says
    return transformers.AutoModelForCausalLM.from_config(cfg)


class TokenIds(torch.utils.data.Dataset):
    """Random token ids, their own labels."""

    def __init__(self, n: int = 4 * BATCH):
        self.ids = torch.randint(0, VOCAB, (n, SEQ), generator=torch.Generator().manual_seed(1))

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def trainer(model, out_dir, callbacks=(), **args):
    """A Trainer of `model` for 3 steps on CPU (shuffled data, dropout on, seed 0); `args` go to TrainingArguments."""
    import transformers

    options = dict(
        output_dir=str(out_dir),
        max_steps=3,
        per_device_train_batch_size=BATCH,
        report_to=[],
        use_cpu=True,
        save_strategy="no",
        seed=0,
        logging_steps=100,
        disable_tqdm=True,
        learning_rate=1e-3,
    )
    training_args = transformers.TrainingArguments(**{**options, **args})
    return transformers.Trainer(model=model, args=training_args, train_dataset=TokenIds(), callbacks=list(callbacks))


def trained(model, out_dir, callbacks=(), **args):
    """`model` after 3 steps of `trainer(...)`."""
    trainer(model, out_dir, callbacks, **args).train()
    return model


def parameters(model) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in model.named_parameters()}


def differing(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> list[str]:
    """Names whose tensors are not bit-equal (or missing on one side)."""
    return sorted(n for n in a.keys() | b.keys() if n not in a or n not in b or not torch.equal(a[n], b[n]))
