"""`remat fit` / `remat.fit.will_it_fit`: a Hugging Face config, built on the meta device, its training step predicted
for a GPU.  Every config is written here (nothing downloads); the tiny models' dimensions are multiples of 256, so
every parameter's bytes are a multiple of the CUDA allocator's 512 bytes and the byte counts below are exact."""

from __future__ import annotations

import json
import re
import sys

import pytest
import torch

import remat
from remat.cli import main
from remat.fit import AS_IS, NO, WITH_PLAN, FitError, will_it_fit
from remat.fit.answer import gib
from remat.fit.outcome import fits_reserve, with_margin

H, I, HEADS, KV, V = 512, 1024, 8, 4, 2048  # noqa: E741  hidden, intermediate, heads, key/value heads, vocabulary
KVD = H // HEADS * KV  # width of the key and value projections
SMALL = {
    "hidden_size": 256,
    "intermediate_size": 512,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 1024,
}


def llama(layers: int = 2, **changes) -> dict:
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": H,
        "intermediate_size": I,
        "num_hidden_layers": layers,
        "num_attention_heads": HEADS,
        "num_key_value_heads": KV,
        "vocab_size": V,
        "max_position_embeddings": 4096,
        "tie_word_embeddings": False,
        "rms_norm_eps": 1e-5,
        **changes,
    }


def bert() -> dict:
    return {
        "architectures": ["BertForMaskedLM"],
        "model_type": "bert",
        "hidden_size": H,
        "intermediate_size": I,
        "num_hidden_layers": 2,
        "num_attention_heads": HEADS,
        "vocab_size": V,
        "max_position_embeddings": 512,
        "type_vocab_size": 2,
        "hidden_dropout_prob": 0.1,
        "attention_probs_dropout_prob": 0.1,
    }


STEP = 512
"""Fused AdamW keeps each parameter tensor's step count on the GPU: a float32 scalar, one 512-byte block."""


def llama_tensors(layers: int = 2) -> int:
    """Per layer q, k, v, o, gate, up, down and two norms; the embedding, the final norm and the head."""
    return 9 * layers + 3


def llama_parameters(layers: int = 2) -> int:
    """Embedding, per layer q/k/v/o + gate/up/down + two RMSNorms, the final norm, an untied output head."""
    per_layer = H * H + 2 * H * KVD + H * H + 3 * H * I + 2 * H
    return V * H + layers * per_layer + H + V * H


def bert_parameters() -> int:
    """Word, position and type embeddings + LayerNorm; per layer attention (with biases), LayerNorm, the MLP and
    LayerNorm; the MLM head's transform + LayerNorm and the decoder's bias (its weight is the word embedding)."""
    per_layer = 4 * (H * H + H) + 2 * H + (H * I + I) + (I * H + H) + 2 * H
    return V * H + 512 * H + 2 * H + 2 * H + 2 * per_layer + (H * H + H) + 2 * H + V


def lora_parameters(rank: int, layers: int = 2) -> int:
    """r x (in + out) for each linear layer of each block (peft's "all-linear" leaves the output head alone)."""
    shapes = [(H, H), (H, KVD), (H, KVD), (H, H), (H, I), (H, I), (I, H)]
    return layers * sum(rank * (fan_in + fan_out) for fan_in, fan_out in shapes)


@pytest.fixture(scope="module")
def configs(tmp_path_factory):
    root = tmp_path_factory.mktemp("configs")
    made = {
        "llama": llama(),
        "bert": bert(),
        "llama4": llama(4, **SMALL),
        "vit_mim": {"model_type": "vit", "architectures": ["ViTForMaskedImageModeling"]},
        "no_type": {"hidden_size": 8},
    }
    for name, config in made.items():
        (root / name).mkdir()
        (root / name / "config.json").write_text(json.dumps(config))
    (root / "empty").mkdir()
    return {name: str(root / name) for name in [*made, "empty"]}


@pytest.fixture(scope="module")
def big(configs):
    """The 2-layer Llama, bf16, batch 8 x 512, on an 80 GB GPU: fits as is."""
    return will_it_fit(configs["llama"], "80GB", seq=512, batch=8)


# -- the step's bytes are the config's ------------------------------------------------------------------------


def test_parameters_gradients_and_adamw_state_are_the_configs_in_bf16(big):
    n = llama_parameters()
    prof = big.profile
    assert big.params == big.trainable == n
    assert prof.param_bytes == prof.grad_bytes == 2 * n  # bf16
    assert prof.optimizer_bytes == 2 * 2 * n + STEP * llama_tensors()  # AdamW's two moments, in the parameters' dtype
    assert big.outcome.verdict == AS_IS and big.fits and big.exit_status == 0
    assert fits_reserve(prof.gpu_reserve.reserved_bytes, 80 * 10**9)
    assert "answer: fits as is" in str(big)


@pytest.mark.parametrize("dtype, size, autocast", [("fp32", 4, False), ("amp-bf16", 4, True)])
def test_fp32_weights_with_and_without_autocast(configs, dtype, size, autocast):
    prof = will_it_fit(configs["llama"], "80GB", seq=128, batch=2, dtype=dtype).profile
    n = llama_parameters()
    assert prof.param_bytes == prof.grad_bytes == size * n
    assert prof.optimizer_bytes == 2 * size * n + STEP * llama_tensors()
    assert any("autocast('cuda', bfloat16)" in note for note in prof.notes) == autocast


def test_a_bert_config_is_a_masked_lm_with_its_embedding_tied(configs):
    answer = will_it_fit(configs["bert"], "80GB", seq=128, batch=2)
    assert answer.model == "BertForMaskedLM"
    assert answer.params == bert_parameters()
    assert answer.profile.param_bytes == 2 * bert_parameters()


def test_a_question_answering_head_is_built_not_a_masked_lm(configs, tmp_path):
    """BertForQuestionAnswering was trained as a masked LM: its step held logits over the vocabulary, where the QA
    head gives two numbers a token, and the answer said "BertForMaskedLM"."""
    (tmp_path / "config.json").write_text(json.dumps(bert() | {"architectures": ["BertForQuestionAnswering"]}))
    qa = will_it_fit(str(tmp_path), "80GB", seq=512, batch=8, changes=())
    mlm = will_it_fit(configs["bert"], "80GB", seq=512, batch=8, changes=())
    assert qa.model == "BertForQuestionAnswering" and qa.notes == []
    mlm_head = (H * H + H) + 2 * H + V  # the transform, its LayerNorm, the decoder's bias
    assert qa.params == bert_parameters() - mlm_head + (2 * H + 2)  # qa_outputs: a start and an end logit
    logits = 8 * 512 * V * 2  # the masked LM's bf16 logits, which the QA step never makes
    assert qa.profile.peak_bytes <= mlm.profile.peak_bytes - logits


@pytest.mark.parametrize(
    "arch, task",
    [("BertForNextSentencePrediction", "next sentence prediction")],
)
def test_a_head_of_another_task_is_refused_not_replaced(tmp_path, arch, task):
    (tmp_path / "config.json").write_text(json.dumps(bert() | {"architectures": [arch]}))
    with pytest.raises(FitError, match=f"^remat: the config's architectures name {arch}, .* its {task} models") as e:
        will_it_fit(str(tmp_path), "80GB", seq=128)
    assert "question answering, multiple choice and image classification heads" in str(e.value)
    assert "Fix: profile your own model" in str(e.value)


def test_a_multiple_choice_row_is_a_sequence_per_answer(tmp_path):
    """BertForMultipleChoice was refused.  Its rows are `--choices` sequences each (4 by default, SWAG's), all
    through the encoder: 2 rows of 4 choices are the activations of 8 sequences, twice those of 2 rows of 2."""
    (tmp_path / "config.json").write_text(json.dumps(bert() | {"architectures": ["BertForMultipleChoice"]}))
    four = will_it_fit(str(tmp_path), "80GB", seq=128, batch=2, changes=())
    assert four.model == "BertForMultipleChoice" and four.notes == []
    mlm_head = (H * H + H) + 2 * H + V  # the transform, its LayerNorm, the decoder's bias
    assert four.params == bert_parameters() - mlm_head + (H * H + H) + (H + 1)  # the pooler; a score per choice
    assert "step: batch 2 x 4 choices of 128 tokens (--choices for another number) per GPU" in str(four)
    two = will_it_fit(str(tmp_path), "80GB", seq=128, batch=2, choices=2, changes=())
    eight = will_it_fit(str(tmp_path), "80GB", seq=128, batch=8, choices=1, changes=())
    assert "step: batch 2 x 2 choices of 128 tokens per GPU" in str(two)
    assert four.profile.input_bytes == 2 * 4 * 128 * 8 + 512  # int64 token ids; a label a row, in a 512-byte block
    assert abs(four.profile.activation_bytes - eight.profile.activation_bytes) <= 0.01 * eight.profile.activation_bytes
    assert abs(four.profile.activation_bytes - 2 * two.profile.activation_bytes) <= 0.02 * four.profile.activation_bytes


def test_lora_on_a_multiple_choice_model_trains_its_classifier_in_full(tmp_path):
    """peft has no multiple choice task: with "all-linear" alone the new classifier got adapters, its random
    weights frozen."""
    (tmp_path / "config.json").write_text(json.dumps(bert() | {"architectures": ["BertForMultipleChoice"]}))
    answer = will_it_fit(str(tmp_path), "80GB", seq=128, lora=4, changes=())
    adapters = 2 * (4 * 4 * (H + H) + 4 * (H + I) + 4 * (I + H)) + 4 * (H + H)  # the layers' and the pooler's
    assert answer.trainable == adapters + (H + 1)
    assert answer.notes[0].startswith("classifier trained in full, not by adapters (peft's modules_to_save")


def test_task_builds_the_head_the_training_script_builds(tmp_path):
    """A pretrained checkpoint's config names its pretraining head (BertForMaskedLM); fine-tuned for multiple choice
    it is another model: --task multiple-choice builds that one, with --choices rows, as its own config would."""
    (tmp_path / "config.json").write_text(json.dumps(bert()))
    (tmp_path / "mc").mkdir()
    (tmp_path / "mc" / "config.json").write_text(json.dumps(bert() | {"architectures": ["BertForMultipleChoice"]}))
    tasked = will_it_fit(str(tmp_path), "80GB", seq=128, batch=2, task="multiple-choice", changes=())
    named = will_it_fit(str(tmp_path / "mc"), "80GB", seq=128, batch=2, changes=())
    assert tasked.model == named.model == "BertForMultipleChoice" and tasked.params == named.params
    assert tasked.profile.peak_bytes == named.profile.peak_bytes
    assert "step: batch 2 x 4 choices of 128 tokens" in str(tasked)
    for spelled in ("AutoModelForMultipleChoice", "MultipleChoice", "multiple_choice"):
        assert will_it_fit(str(tmp_path), "80GB", seq=128, task=spelled, changes=()).model == "BertForMultipleChoice"
    assert will_it_fit(str(tmp_path / "mc"), "80GB", seq=128, task="masked-lm", changes=()).model == "BertForMaskedLM"


def test_a_task_the_model_type_has_no_class_for_says_which_it_has(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(llama()))
    with pytest.raises(FitError, match="^remat: --task multiple-choice builds AutoModelForMultipleChoice") as e:
        will_it_fit(str(tmp_path), "80GB", seq=128, task="multiple-choice")
    said = str(e.value)
    assert "no such class for the config's model type 'llama'" in said
    assert "a task it has: causal-lm, sequence-classification, token-classification, question-answering" in said
    assert "Fix: --task causal-lm, or leave --task out" in said


def test_a_config_transformers_cannot_build_from_is_a_remat_error(tmp_path, monkeypatch):
    """transformers' constructors raise what they raise: an activation the config names that does not exist was a
    KeyError traceback, and LayoutLMv2's detectron2, missing, an ImportError one."""
    (tmp_path / "config.json").write_text(json.dumps(llama(hidden_act="swishy")))
    with pytest.raises(
        FitError, match="^remat: transformers .* could not build LlamaForCausalLM from this config"
    ) as e:
        will_it_fit(str(tmp_path), "80GB", seq=64, changes=())
    assert "saw KeyError: " in str(e.value) and "swishy" in str(e.value) and "Fix: compare the config" in str(e.value)
    import transformers

    def needs(config, **kwargs):
        raise ImportError("LlamaForCausalLM requires the detectron2 library but it was not found in your environment.")

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_config", needs)
    (tmp_path / "config.json").write_text(json.dumps(llama()))
    with pytest.raises(FitError, match="^remat: transformers builds LlamaForCausalLM only with a package") as e:
        will_it_fit(str(tmp_path), "80GB", seq=64, changes=())
    assert "saw ImportError: LlamaForCausalLM requires the detectron2 library" in str(e.value)
    assert "Fix: install that package (pip)" in str(e.value)


def test_a_classifier_whose_text_config_keeps_the_padding_token_gets_one(tmp_path):
    """Qwen3.5's classifier reads `config.get_text_config().pad_token_id`; only the outer config got one, and a
    batch of 2 was "Cannot handle batch sizes > 1 if no padding token is defined"."""
    transformers = pytest.importorskip("transformers")
    text = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4, head_dim=16)
    text |= dict(num_key_value_heads=2, vocab_size=256, linear_num_key_heads=2, linear_num_value_heads=4)
    text |= dict(linear_key_head_dim=16, linear_value_head_dim=16)
    vision = dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=64)
    config = transformers.Qwen3_5Config(text_config=text, vision_config=vision).to_dict()
    assert config["text_config"].get("pad_token_id") is None
    config["architectures"] = ["Qwen3_5ForSequenceClassification"]
    (tmp_path / "config.json").write_text(json.dumps(config))
    answer = will_it_fit(str(tmp_path), "80GB", seq=64, batch=2, changes=())
    assert answer.model == "Qwen3_5ForSequenceClassification" and answer.outcome.verdict == AS_IS


def test_a_reformer_is_told_the_one_sequence_length_it_trains_on(tmp_path):
    """Reformer's axial position embeddings train on sequences of exactly their product: the fix was the model's own
    words inside remat.profile's ("check that the inputs match what the model takes")."""
    config = {"model_type": "reformer", "architectures": ["ReformerForSequenceClassification"], "hidden_size": 64}
    config |= {"attn_layers": ["local", "local"], "axial_pos_shape": [8, 8], "axial_pos_embds_dim": [32, 32]}
    config |= {"num_attention_heads": 2, "attention_head_size": 32, "feed_forward_size": 128, "vocab_size": 320}
    config |= {"max_position_embeddings": 64, "local_attn_chunk_length": 16}
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(FitError, match="^remat: ReformerForSequenceClassification's training step failed") as e:
        will_it_fit(str(tmp_path), "80GB", seq=32, changes=())
    assert "it trains on sequences of 64 tokens (its axial_pos_shape). Fix: --seq 64." in str(e.value)
    assert will_it_fit(str(tmp_path), "80GB", seq=64, changes=()).model == "ReformerForSequenceClassification"
    small = will_it_fit(str(tmp_path), "40MiB", seq=64, batch=64)  # a shorter --seq was tried, and failed the answer
    assert small.outcome.verdict == NO and small.suggestions and "seq" not in {s.kind for s in small.suggestions}


def test_a_model_whose_forward_needs_more_than_the_batch_is_told_so_in_remat_fit_words(tmp_path):
    """X-MOD's forward needs a language set: the error was remat.profile's, "check that the inputs match what the
    model takes (try calling it yourself first)", nothing a `remat fit` user can act on."""
    config = {"model_type": "xmod", "architectures": ["XmodForSequenceClassification"], "hidden_size": 64}
    config |= {"num_hidden_layers": 1, "num_attention_heads": 2, "intermediate_size": 128, "vocab_size": 256}
    config |= {"languages": ["en_XX"]}
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(FitError, match="^remat: XmodForSequenceClassification's forward failed on remat fit's") as e:
        will_it_fit(str(tmp_path), "80GB", seq=64, batch=2, changes=())
    said = str(e.value)
    assert "batch of 2 x 64 tokens: ValueError: Input language unknown." in said
    assert "Fix: profile the model with your own batch, `remat profile file.py:factory --mode fake" in said


def test_a_bart_for_conditional_generation_is_a_seq2seq_lm(tmp_path):
    """BartForConditionalGeneration is in transformers' masked LM mapping too: it was built as a masked LM, the same
    class, without the note that its decoder is given labels of --seq tokens."""
    config = {"model_type": "bart", "architectures": ["BartForConditionalGeneration"], "d_model": 256}
    config |= {"encoder_layers": 1, "decoder_layers": 1, "encoder_ffn_dim": 512, "decoder_ffn_dim": 512}
    config |= {"encoder_attention_heads": 4, "decoder_attention_heads": 4, "vocab_size": 1024}
    (tmp_path / "config.json").write_text(json.dumps(config))
    answer = will_it_fit(str(tmp_path), "80GB", seq=128, changes=())
    assert answer.model == "BartForConditionalGeneration"
    assert answer.notes == ["the decoder is given labels of 128 tokens per sequence, as many as the encoder reads"]


def whisper(**changes) -> dict:
    return {
        "architectures": ["WhisperForConditionalGeneration"],
        "model_type": "whisper",
        "d_model": 256,
        "encoder_layers": 2,
        "decoder_layers": 2,
        "encoder_attention_heads": 4,
        "decoder_attention_heads": 4,
        "encoder_ffn_dim": 512,
        "decoder_ffn_dim": 512,
        "num_mel_bins": 128,
        "vocab_size": 1024,
        "max_source_positions": 1500,
        "max_target_positions": 64,
        "pad_token_id": 0,
        "bos_token_id": 1,
        "eos_token_id": 1,
        "decoder_start_token_id": 2,
        **changes,
    }


def test_whisper_is_its_speech_model_reading_30_s_of_audio_a_row(tmp_path):
    """WhisperForConditionalGeneration was trained as WhisperForCausalLM: its decoder alone, without the encoder that
    reads the audio (most of the step's activations)."""
    from transformers import WhisperConfig, WhisperForConditionalGeneration

    (tmp_path / "config.json").write_text(json.dumps(whisper()))
    answer = will_it_fit(str(tmp_path), "80GB", seq=64, batch=2, changes=())
    assert answer.model == "WhisperForConditionalGeneration" and answer.notes == []
    with torch.device("meta"):
        model = WhisperForConditionalGeneration(WhisperConfig(**whisper()))
    assert answer.params == sum(p.numel() for p in model.parameters())
    assert answer.params - answer.trainable == 1500 * 256  # the encoder's positions, which Whisper freezes
    assert "trained, the rest frozen;" in str(answer).splitlines()[0]
    assert "step: batch 2 x 30 s of audio (3000 log-mel frames) and 64 label tokens per GPU" in str(answer)
    frames = 2 * 128 * 3000 * 2  # the batch's bf16 log-mel frames
    assert answer.profile.input_bytes >= frames
    assert {b.name for b in answer.profile.blocks} >= {"model.encoder.layers.0", "model.decoder.layers.1"}


def test_a_whisper_config_without_architectures_is_not_its_decoder_alone(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(whisper(architectures=None)))
    answer = will_it_fit(str(tmp_path), "80GB", seq=64, batch=2, changes=())
    assert answer.model == "WhisperForConditionalGeneration"
    assert answer.notes == ["the config names no architectures: trained as a speech sequence-to-sequence model"]


def test_more_label_tokens_than_whisper_allows(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(whisper()))
    with pytest.raises(FitError, match=r"at most 64 positions \(max_target_positions\)\. Fix: --seq 64 or shorter"):
        will_it_fit(str(tmp_path), "80GB", seq=128, changes=())


def test_a_deberta_classifier_is_trained_with_single_label_cross_entropy(tmp_path):
    """DeBERTa-v3's sequence classifier, its config's problem_type unset, picks its labelled rows with nonzero():
    `remat fit` stopped with "fake mode cannot run op aten.nonzero" on the model most used for classification."""
    config = {"architectures": ["DebertaV2ForSequenceClassification"], "model_type": "deberta-v2", "num_labels": 3}
    config |= {"hidden_size": 64, "num_hidden_layers": 1, "num_attention_heads": 4, "intermediate_size": 128}
    config |= {"vocab_size": 512, "relative_attention": True, "pos_att_type": ["p2c", "c2p"], "type_vocab_size": 0}
    (tmp_path / "config.json").write_text(json.dumps(config))
    answer = will_it_fit(str(tmp_path), "80GB", seq=64, batch=2, changes=())
    assert answer.model == "DebertaV2ForSequenceClassification" and answer.fits
    assert answer.params == _hf_parameters(config, "AutoModelForSequenceClassification")


def test_lora_trains_a_question_answering_or_classification_head_in_full_without_adapters(tmp_path):
    """peft's QA and classification models train their head in full (`modules_to_save`, picked by the end of the
    module's name), and cannot wrap one "all-linear" gave adapters: BERT's `qa_outputs` and DistilBERT's
    `pre_classifier` stopped `remat fit --lora` with peft's TypeError."""
    (tmp_path / "config.json").write_text(json.dumps(bert() | {"architectures": ["BertForQuestionAnswering"]}))
    qa = will_it_fit(str(tmp_path), "80GB", seq=64, batch=2, lora=4, changes=())
    per_layer = 4 * 4 * (H + H) + 4 * (H + I) + 4 * (I + H)  # q, k, v, o; the MLP's two
    assert qa.trainable == 2 * per_layer + (H * 2 + 2)  # the adapters, and qa_outputs in full
    saved = "trained in full, not by adapters (peft's modules_to_save for this head): in bf16, with their gradients"
    assert qa.notes == [f"qa_outputs {saved} and AdamW state"]
    distil = {"architectures": ["DistilBertForSequenceClassification"], "model_type": "distilbert", "dim": 64}
    distil |= {"n_layers": 1, "n_heads": 4, "hidden_dim": 128, "vocab_size": 512}
    (tmp_path / "config.json").write_text(json.dumps(distil))
    cls = will_it_fit(str(tmp_path), "80GB", seq=64, batch=2, lora=4, changes=())
    adapters = 4 * 4 * (64 + 64) + 4 * (64 + 128) + 4 * (128 + 64)
    assert cls.trainable == adapters + (64 * 64 + 64) + (64 * 2 + 2)  # pre_classifier and classifier in full
    assert cls.notes == [f"pre_classifier, classifier {saved} and AdamW state"]


def test_lora_adapts_gpt2s_conv1d_layers_and_trains_its_score_in_full(tmp_path):
    """GPT-2's layers are transformers' Conv1D, which peft's "all-linear" adapts: counting nn.Linear alone, a
    GPT-2 classifier (its only nn.Linear the score head, trained in full) was refused as having nothing to adapt."""
    config = {"architectures": ["GPT2ForSequenceClassification"], "model_type": "gpt2", "n_embd": 64, "n_layer": 2}
    config |= {"n_head": 4, "vocab_size": 256, "n_positions": 128}
    (tmp_path / "config.json").write_text(json.dumps(config))
    answer = will_it_fit(str(tmp_path), "80GB", seq=64, batch=2, lora=4, changes=())
    per_layer = 4 * ((64 + 192) + (64 + 64) + (64 + 256) + (256 + 64))  # c_attn, attn.c_proj, c_fc, mlp.c_proj
    assert answer.trainable == 2 * per_layer + 64 * 2  # the adapters; the score head in full (no bias)


def test_a_step_that_reads_its_batchs_values_is_a_remat_error_in_fit_words(tmp_path):
    """BART's classifier checks its rows' end-of-sequence tokens with unique_consecutive: the fake step stopped
    with remat.profile's error, whose fix (`--mode real`) is no flag of `remat fit`."""
    config = {"architectures": ["BartForSequenceClassification"], "model_type": "bart", "d_model": 64}
    config |= {"encoder_layers": 1, "decoder_layers": 1, "encoder_ffn_dim": 128, "decoder_ffn_dim": 128}
    config |= {"encoder_attention_heads": 4, "decoder_attention_heads": 4, "vocab_size": 256}
    (tmp_path / "config.json").write_text(json.dumps(config))
    expected = r"^remat: BartForSequenceClassification's training step runs aten.unique_consecutive.default, .*"
    with pytest.raises(
        FitError, match=expected + r"Fix: measure the step on a GPU with your own batch, `remat profile"
    ):
        will_it_fit(str(tmp_path), "80GB", seq=64, changes=())


def vit(**changes) -> dict:
    return {
        "architectures": ["ViTForImageClassification"],
        "model_type": "vit",
        "hidden_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "intermediate_size": 256,
        "image_size": 32,
        "patch_size": 8,
        "num_labels": 10,
        **changes,
    }


def _hf_parameters(config: dict, auto: str = "AutoModelForImageClassification") -> int:
    """The parameters transformers' own model of `config` has (an image classifier's by default)."""
    import transformers

    with torch.device("meta"):
        model = getattr(transformers, auto).from_config(transformers.AutoConfig.for_model(**config))
    return sum(p.numel() for p in model.parameters())


def test_an_image_classifier_is_built_reading_images_of_its_configs_size(tmp_path):
    """ViTForImageClassification was refused (only text heads were built): remat fit answered nothing for the
    image models people fine-tune most."""
    (tmp_path / "config.json").write_text(json.dumps(vit()))
    answer = will_it_fit(str(tmp_path), "80GB", batch=4, dtype="fp32", changes=())
    assert answer.model == "ViTForImageClassification" and answer.notes == []
    assert answer.params == answer.trainable == _hf_parameters(vit())
    assert "step: batch 4 x 3 x 32 x 32 pixels (the config's image_size; --image-size for another) per GPU" in str(
        answer
    )
    assert "tokens" not in str(answer)
    assert answer.profile.input_bytes >= 4 * 3 * 32 * 32 * 4  # the batch's fp32 pixels
    layers = {b.name for b in answer.profile.blocks if re.fullmatch(r"vit\.(encoder\.layer|layers)\.\d", b.name)}
    assert len(layers) == 2  # the encoder's blocks profiled (transformers 5.25 names them vit.layers.N)
    with pytest.raises(FitError, match=r"^remat: ViT is an image classifier: .* \(3 x 32 x 32 pixels\), not tokens; "):
        will_it_fit(str(tmp_path), "80GB", seq=512)


def test_another_image_size_interpolates_the_position_embeddings(tmp_path):
    """`--image-size 64` on a config of 32: ViT refuses another size unless asked to interpolate, as Hugging Face
    fine-tunes it at 384 from 224; the parameters stay the checkpoint's, the activations grow with the patches."""
    (tmp_path / "config.json").write_text(json.dumps(vit()))
    small = will_it_fit(str(tmp_path), "80GB", batch=4, dtype="fp32", changes=())
    large = will_it_fit(str(tmp_path), "80GB", batch=4, dtype="fp32", image_size=64, changes=())
    assert large.params == small.params and "step: batch 4 x 3 x 64 x 64 pixels per GPU" in str(large)
    patches = lambda a: 4 * 128 * 4 * (a // 8) ** 2  # noqa: E731  one fp32 hidden state of the batch's patches
    assert large.profile.activation_bytes - small.profile.activation_bytes >= 2 * (patches(64) - patches(32))


def test_a_base_vision_model_is_trained_as_an_image_classifier(tmp_path):
    config = {"architectures": ["Dinov2Model"], "model_type": "dinov2", "hidden_size": 64, "num_hidden_layers": 1}
    config |= {"num_attention_heads": 4, "image_size": 28, "patch_size": 14}
    (tmp_path / "config.json").write_text(json.dumps(config))
    answer = will_it_fit(str(tmp_path), "80GB", batch=2, changes=())
    assert answer.model == "Dinov2ForImageClassification"
    assert answer.notes == ["architectures names Dinov2Model: trained as an image classifier"]


def test_lora_on_an_image_classifier_trains_its_new_classifier_in_full(tmp_path):
    """peft's "all-linear" put adapters on the classifier too, a head with no pretrained weights to adapt."""
    (tmp_path / "config.json").write_text(json.dumps(vit()))
    answer = will_it_fit(str(tmp_path), "80GB", batch=2, lora=4, changes=())
    linears = 2 * (4 * 4 * (128 + 128) + 4 * (128 + 256) + 4 * (256 + 128))  # q, k, v, o; the MLP's two
    assert answer.trainable == linears + (128 * 10 + 10)
    assert answer.notes == [
        "classifier trained in full, not by adapters (peft's modules_to_save for this head): in bf16, with their "
        "gradients and AdamW state"
    ]


def test_image_classifiers_that_cannot_be_trained_as_asked(tmp_path):
    resnet = {"architectures": ["ResNetForImageClassification"], "model_type": "resnet", "embedding_size": 8}
    resnet |= {"hidden_sizes": [8, 16], "depths": [1, 1], "num_labels": 10}
    (tmp_path / "config.json").write_text(json.dumps(resnet))
    with pytest.raises(
        FitError, match=r"^remat: an image classifier's rows .* ResNetConfig has none .*--image-size 224"
    ):
        will_it_fit(str(tmp_path), "80GB")
    assert will_it_fit(str(tmp_path), "80GB", image_size=32, changes=()).params == _hf_parameters(resnet)
    with pytest.raises(FitError, match=r"^remat: --lora 4 adds .* ResNetForImageClassification has none but its head"):
        will_it_fit(str(tmp_path), "80GB", image_size=32, lora=4)
    deit = vit(architectures=["DeiTForImageClassificationWithTeacher"], model_type="deit")
    (tmp_path / "config.json").write_text(json.dumps(deit))
    expected = r"^remat: DeiTForImageClassificationWithTeacher returned no loss from .* Fix: name the class that trains"
    with pytest.raises(FitError, match=expected):
        will_it_fit(str(tmp_path), "80GB")


def test_lora_trains_only_its_adapters_in_fp32(configs):
    answer = will_it_fit(configs["llama"], "80GB", seq=128, batch=2, lora=8)
    prof, adapters = answer.profile, lora_parameters(8)
    assert answer.trainable == adapters and answer.params == llama_parameters() + adapters
    assert prof.param_bytes == 2 * llama_parameters() + 4 * adapters  # the base in bf16, peft's adapters in fp32
    assert prof.grad_bytes == 4 * adapters
    assert prof.optimizer_bytes == 2 * 4 * adapters + STEP * 2 * 7 * 2  # 2 layers of 7 adapters, A and B
    head = str(answer).splitlines()[0]  # said "weights, gradients and AdamW state in bf16" of 4-byte adapters
    assert head.endswith(
        f"{answer.trainable / 1e6:,.1f} M trained (LoRA r=8); the base's weights in bf16, frozen; "
        "the adapters, their gradients and AdamW state in fp32"
    ), head


def test_two_gpus_halve_the_parameters_gradients_and_optimizer_state(configs, big):
    prof = will_it_fit(configs["llama"], "80GB", seq=512, batch=8, world_size=2).profile
    assert (prof.parallel, prof.world_size) == ("fsdp", 2)
    assert 2 * prof.param_bytes == big.profile.param_bytes
    steps = STEP * llama_tensors()  # each rank keeps every tensor's step counter
    assert 2 * (prof.optimizer_bytes - steps) == big.profile.optimizer_bytes - steps


# -- the three answers ---------------------------------------------------------------------------------------------


def test_fits_with_a_plan_whose_replayed_reserve_is_under_the_gpu(configs, big, tmp_path, capsys):
    budget = int(0.8 * big.profile.gpu_reserve.reserved_bytes)  # under the unplanned step, over the least plan
    out = tmp_path / "plan.json"
    assert (
        main(["fit", configs["llama"], "--gpu", f"{budget}B", "--seq", "512", "--batch", "8", "--out", str(out)]) == 0
    )
    text = capsys.readouterr().out
    assert "answer: fits with this plan at +" in text and "checkpoints" in text and "model.layers." in text
    plan = remat.load_plan(str(out))
    assert plan.segments or plan.selective
    assert plan.peak_bytes < budget and fits_reserve(plan.gpu_reserve.reserved_bytes, budget)
    assert plan.budget_bytes == budget


def test_does_not_fit_gives_the_least_budget_of_remat_plan(configs, big):
    budget = 64 * 2**20
    answer = will_it_fit(configs["llama"], f"{budget}B", seq=512, batch=8, changes=())
    assert answer.outcome.verdict == NO and answer.exit_status == 1 and not answer.suggestions
    with pytest.raises(remat.InfeasibleBudget) as e:
        remat.plan(answer.profile, budget)
    assert answer.outcome.least_bytes == e.value.min_bytes > budget
    states = 4 * big.profile.param_bytes + STEP * llama_tensors()  # parameters + gradients + 2 moments + steps
    assert answer.outcome.states_bytes == states
    assert "answer: does not fit: the least any checkpointing plan needs is" in str(answer)


def test_a_least_at_the_optimizer_step_says_so_with_adamws_temporaries(configs):
    """Falcon-7B on 24 GiB: "the least any checkpointing plan needs is 64.5 GiB ...; parameters, gradients and
    optimizer state alone are 51.6 GiB" left 12.9 GiB unexplained: AdamW's foreach kernels make a temporary of
    every parameter's size in the optimizer step, which no plan changes."""
    answer = will_it_fit(configs["llama"], "4MiB", seq=16, batch=1, optim="adamw_torch", changes=())
    prof, o = answer.profile, answer.outcome
    assert o.verdict == NO and o.least_bytes == prof.peak_bytes and prof.peak_phase == "optimizer"
    states, temporaries = gib(o.states_bytes), gib(prof.param_bytes)  # sqrt(exp_avg_sq) of every parameter
    assert _line_after_answer(answer) == (
        f"  the least is the optimizer step's peak, which no checkpoint lowers: those {states}, {temporaries} of "
        "AdamW's temporaries (its foreach kernels' intermediates; fused AdamW, --optim adamw_torch_fused, updates in "
        "place), and cuBLAS's workspaces, 64.0 MiB"
    )
    assert "per GPU, AdamW (foreach kernels), the loss kept" in str(answer)


def test_fused_adamw_the_trainers_default_makes_no_temporaries(configs):
    """Hugging Face's Trainer trains with torch's fused AdamW (optim="adamw_torch_fused", its default with torch 2.8
    or newer), which updates each tensor in place: `remat fit` predicted the foreach kernels' temporaries of every
    parameter's size for it (Llama-3-8B's full fine-tuning: 15.0 GiB)."""
    foreach = will_it_fit(configs["llama"], "4MiB", seq=16, batch=1, optim="adamw_torch", changes=())
    fused = will_it_fit(configs["llama"], "4MiB", seq=16, batch=1, changes=())
    assert fused.outcome.setup.optim == "adamw_torch_fused" and "per GPU, fused AdamW, the loss kept" in str(fused)
    optimizer = [a.profile.timeline.phase_peak("optimizer") for a in (foreach, fused)]
    # the foreach kernels' sqrt(exp_avg_sq) of every parameter, less the step counters fused AdamW keeps on the GPU
    assert optimizer[0] - optimizer[1] == fused.profile.param_bytes - STEP * llama_tensors()
    assert fused.outcome.least_bytes < foreach.outcome.least_bytes
    assert "AdamW's temporaries" not in str(fused)


def _line_after_answer(answer) -> str:
    lines = str(answer).splitlines()
    return lines[next(i for i, s in enumerate(lines) if s.startswith("answer:")) + 1]


def test_a_suggested_batch_estimated_from_shallow_copies_fits_when_run(configs, monkeypatch):
    monkeypatch.setattr("remat.fit.suggest.EXTRAPOLATE_FROM", 4)  # the 4-layer model's changes are estimated
    budget = 130 * 2**20  # batch 1's least plan reserves 116-120 MiB, batch 2's 136-138 (replayed on the whole model)
    answer = will_it_fit(configs["llama4"], f"{budget}B", seq=1024, batch=4, changes=("batch",))
    assert answer.outcome.verdict == NO
    fitting = [s for s in answer.suggestions if s.outcome.fits]
    assert fitting and all(s.outcome.estimated for s in answer.suggestions)
    least = fitting[0]  # the largest batch that fits: the one before it does not
    assert [s.change for s in answer.suggestions][-2:] == ["--batch 2", "--batch 1"]
    rerun = will_it_fit(configs["llama4"], f"{budget}B", seq=1024, batch=least.outcome.setup.batch, changes=())
    assert rerun.fits and rerun.outcome.verdict in (AS_IS, WITH_PLAN)
    assert f"so: {least.change}" in str(answer)


def test_layers_are_counted_and_cut_where_each_config_keeps_them():
    """GPT-2 counts its layers in "n_layer", T5 in "num_layers" and "num_decoder_layers", BART in "encoder_layers"
    and "decoder_layers": the estimate's shallow copies raised KeyError('num_hidden_layers') on all three (a T5-base
    that did not fit 2 GiB ended in a traceback)."""
    from transformers import BartConfig, GPT2Config, T5Config

    from remat.fit.depth import layers_of, stacks_of, with_layers

    gpt2, t5, bart = GPT2Config(n_layer=6), T5Config(num_layers=6), BartConfig(encoder_layers=6, decoder_layers=3)
    assert [stacks_of(c) for c in (gpt2, t5, bart)] == [[6], [6, 6], [6, 3]]
    assert [stacks_of(with_layers(c, 2)) for c in (gpt2, t5, bart)] == [[2], [2, 2], [2, 2]]
    assert with_layers(gpt2, 2).num_hidden_layers == 2 and with_layers(t5, 2).num_decoder_layers == 2
    assert layers_of(gpt2) == 6
    assert layers_of(t5) is layers_of(bart) is None  # an encoder-decoder's changes are its whole model's steps


def test_a_vision_backbones_stages_are_cut_with_its_layers():
    """DINOv2's config names its backbone's output stage by its last layer ("stage24"): a copy with 2 layers raised
    ValueError (out_features not among its stages), and `remat fit` on a DINOv2-L that did not fit a traceback."""
    from transformers import Dinov2Config

    from remat.fit.depth import with_layers

    copy = with_layers(Dinov2Config(num_hidden_layers=24), 2)
    assert copy.num_hidden_layers == 2 and copy.out_features == ["stage2"]


def test_a_gpt2_config_changes_are_estimated_from_copies_cut_in_n_layer(monkeypatch, tmp_path):
    monkeypatch.setattr("remat.fit.suggest.EXTRAPOLATE_FROM", 4)
    config = {"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"], "n_layer": 4, "n_embd": 256}
    config |= {"n_head": 4, "vocab_size": 1024, "n_positions": 1024, "bos_token_id": 0, "eos_token_id": 0}
    (tmp_path / "config.json").write_text(json.dumps(config))
    answer = will_it_fit(str(tmp_path), "64MiB", seq=1024, batch=8, changes=("batch",))
    assert answer.outcome.verdict == NO
    assert "what to change, one at a time (estimated from copies with 1 and 2 of its 4 layers)" in str(answer)
    assert answer.suggestions[-1].change == "--batch 1" and answer.suggestions[-1].outcome.estimated


def test_an_encoder_decoders_changes_are_its_whole_models_steps(monkeypatch, tmp_path):
    """Its copies with 1 and 2 layers of each stack do not extrapolate: T5-base, 8 x 1024 on 2 GiB, was told
    "--seq 128  fits with a plan" by them, where its whole model's least at 128 tokens is 2.1 GiB."""
    monkeypatch.setattr("remat.fit.suggest.EXTRAPOLATE_FROM", 2)
    config = {"model_type": "t5", "d_model": 128, "d_ff": 512, "d_kv": 32, "num_layers": 2, "num_heads": 4}
    config |= {"vocab_size": 512, "decoder_start_token_id": 0, "pad_token_id": 0, "eos_token_id": 1}
    (tmp_path / "config.json").write_text(json.dumps(config))
    answer = will_it_fit(str(tmp_path), "16MiB", seq=512, batch=8, changes=("batch",))
    assert answer.outcome.verdict == NO and answer.suggestions
    assert not any(s.outcome.estimated for s in answer.suggestions)


def test_every_change_ruled_out_by_the_bound_runs_no_step(configs, big):
    budget = 4 * 2**20  # under the parameters alone: no change of batch, sequence, LoRA or GPUs up to 8 fits
    answer = will_it_fit(configs["llama"], f"{budget}B", seq=512, batch=8)
    assert all(s.outcome.skipped for s in answer.suggestions)
    assert {s.kind for s in answer.suggestions} == {"batch", "seq", "lora", "world-size"}
    text = str(answer)
    assert "--batch 4 .. 1" in text and "by a bound" in text and "no single change fits" in text


def test_a_least_plan_the_allocator_fragments_far_over_the_gpu_does_not_fit_with_its_reserve(tmp_path, capsys):
    """Qwen2-1.5B (its published shape, written here), bf16, 2 x 4096 tokens on 24 GiB: the least-memory plan's
    tensors (22.7 GiB, most of them the 152k-word logits and their float32 loss) fit, but the replayed allocator
    reserves 33.8 GiB for them: the 4.6 GiB loss blocks of one step are split by the next step's smaller tensors.
    `remat fit` stopped with "remat: cannot read the budget 0" (NOTE [A plan fits the GPU's reserve], Rule 2)."""
    config = {"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_size": 1536}
    config |= {"intermediate_size": 8960, "num_hidden_layers": 28, "num_attention_heads": 12}
    config |= {"num_key_value_heads": 2, "vocab_size": 151936, "max_position_embeddings": 32768}
    config |= {"rms_norm_eps": 1e-6, "rope_theta": 1e6, "tie_word_embeddings": True}
    (tmp_path / "config.json").write_text(json.dumps(config))
    code = main(["fit", str(tmp_path), "--gpu", "24GiB", "--seq", "4096", "--batch", "2", "--changes", "none"])
    out, err = capsys.readouterr()
    assert code == 1, err
    said = " ".join(out.split())
    match = re.search(r"the least any checkpointing plan needs is ([\d.]+) GiB of GPU memory \(the caching", said)
    assert match and float(match.group(1)) > 24, said
    assert "remat: cannot read the budget" not in err


def test_an_encoder_decoder_plans_both_stacks_below_what_dp_reaches(tmp_path):
    """A T5 whose config names no architectures (BART's on the Hub names BartModel) is a sequence-to-sequence LM
    (it was refused: "no causal LM or masked LM head"), and it fits a GPU that only plans of both stacks reach: dp's
    chain is the encoder's blocks alone (least 410 MiB of tensors here, its replayed reserve 463.8 MiB with the
    margin: "does not fit"), where remat.plan's ilp over the module tree reaches 293 MiB."""
    config = {"model_type": "t5", "d_model": 128, "d_ff": 512, "d_kv": 32, "num_layers": 8, "num_heads": 4}
    config |= {"vocab_size": 512, "decoder_start_token_id": 0, "pad_token_id": 0, "eos_token_id": 1}
    (tmp_path / "config.json").write_text(json.dumps(config))
    answer = will_it_fit(str(tmp_path), "450MiB", seq=512, batch=8, changes=())
    assert answer.model == "T5ForConditionalGeneration"
    assert answer.notes[:2] == [
        "the config names no architectures: trained as a sequence-to-sequence LM",
        "the decoder is given labels of 512 tokens per sequence, as many as the encoder reads",
    ]
    assert answer.outcome.verdict == WITH_PLAN, str(answer)
    plan = answer.plan
    with pytest.raises(remat.InfeasibleBudget) as dp:
        remat.plan(answer.profile, 1, solver="dp")
    assert plan.peak_bytes < dp.value.min_bytes  # under anything dp's chain reaches
    names = [n for seg in plan.segments for n in seg]
    assert any(n.startswith("decoder.") for n in [*names, *plan.selective])  # the stack dp's chain leaves out
    reserve = plan.gpu_reserve
    held = reserve.expandable_reserved_bytes if answer.outcome.allocator else reserve.reserved_bytes
    assert fits_reserve(held, 450 * 2**20)


def test_the_checkpoints_line_numbers_layers_in_order():
    """T5-base's plan listed "decoder.block.10.layer.1-2, decoder.block.11.layer.1-2, decoder.block.2.layer.1-2"."""
    from types import SimpleNamespace

    from remat.fit.answer import checkpoints

    names = ["decoder.block.10.layer.1", "decoder.block.10.layer.2", "decoder.block.2.layer.2", "model.layers.3"]
    plan = SimpleNamespace(segments=[[n] for n in names], selective=["h.11", "h.9", "h.10"], offload=[])
    assert checkpoints(plan) == (
        "decoder.block.2.layer.2, decoder.block.10.layer.1-2, model.layers.3; selective (some ops' outputs kept): h.9-11"
    )


def test_an_estimate_under_the_gpu_in_tensors_but_not_in_reserve_says_its_reserve(monkeypatch):
    """A change whose least-memory plan's tensors fit under the GPU but not with the reserve's margin: the answer said
    "does not fit: the least is about 23.7 GiB of tensors" of a 24 GiB GPU (Falcon-7B, --world-size 8); it says what
    the GPU would need, the replayed reserve with its margin."""
    from remat.fit.estimate import Figures, estimate
    from remat.fit.setup import Setup, parse_gpu
    from remat.fit.suggest import Suggestion
    from remat.fit.answer import _suggestion
    from remat.types.reserve import GpuReserve

    gib = 2**30
    gpu = parse_gpu("24GiB")
    tensors = 23.7 * gib  # under 24 GiB, over 24 GiB / 1.04: the least-memory plan fits no reserve
    shallow = Figures(30 * gib, gib, gib, tensors, 1.0, 4.0, 1.0, 4.0, 10 * gib)
    replay = GpuReserve(0, int(tensors + 1.5 * gib), int(tensors + 0.9 * gib))
    monkeypatch.setattr("remat.fit.estimate.figures", lambda *args: (shallow, lambda: replay))
    outcome = estimate(None, "causal", Setup(seq=2048, world_size=8), gpu, 32)
    assert outcome.verdict == NO and not outcome.close
    need = with_margin(replay.expandable_reserved_bytes)  # the lesser reserve, expandable segments', with the margin
    assert outcome.least_is_reserve and abs(outcome.least_bytes - need) <= 2 and need > gpu.memory_bytes
    said = _suggestion(Suggestion("world-size", "--world-size 8", outcome))
    assert said == "does not fit: the least is about 25.6 GiB reserved", said


# -- errors --------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "argv, expected",
    [
        (["--gpu", "24 gigs"], "remat: --gpu is the GPU's memory with a unit"),
        (["--gpu", "24GiB", "--seq", "0"], "remat: --seq is a whole number of at least 1"),
        (["--gpu", "24GiB", "--changes", "vocab"], "remat: the changes to try are some of batch, seq"),
        (["--gpu", "80GB", "--hardware", "A100", "--lora", "0"], "remat: --lora is the LoRA rank"),
        (["--gpu", "80GB", "--optim", "adam"], "remat: --optim is the optimizer"),
        (["--gpu", "80GB", "--dtype", "int8"], "remat: --dtype is the precision the model trains in"),
        (["--gpu", "80GB", "--image-size", "224"], "remat: --image-size is the side in pixels of an image"),
        (["--gpu", "80GB", "--choices", "4"], "remat: --choices is how many answers each row of a multiple"),
        (["--gpu", "80GB", "--choices", "0"], "remat: --choices is a whole number of at least 1"),
        (["--gpu", "80GB", "--task", "summarization"], "remat: --task is the head the training script builds"),
    ],
)
def test_bad_arguments_are_remat_errors_with_a_fix(configs, capsys, argv, expected):
    assert main(["fit", configs["llama"], *argv]) == 2
    err = capsys.readouterr().err  # progress lines first, where stderr is no terminal; the error last
    assert err.strip().splitlines()[-1].startswith(expected) and "Fix:" in err and "Traceback" not in err


@pytest.mark.parametrize(
    "name, expected",
    [
        ("no_type", 'has no "model_type"'),
        ("empty", "is a folder without a config.json"),
        ("vit_mim", "name ViTForMaskedImageModeling, which transformers"),
        ("missing/config.json", "does not exist"),
    ],
)
def test_configs_that_cannot_be_built(configs, name, expected):
    with pytest.raises(FitError, match="^remat: ") as e:
        will_it_fit(configs.get(name, name), "24GiB")
    assert expected in str(e.value) and "Fix:" in str(e.value)


def test_unknown_dtype_and_a_name_that_needs_the_network(configs, monkeypatch):
    with pytest.raises(FitError, match=r"^remat: --dtype is the precision .* saw 'int8'"):
        will_it_fit(configs["llama"], "24GiB", dtype="int8")
    with pytest.raises(FitError, match=r"^remat: --optim is the optimizer, .* saw 'adam8bit'\. Fix: e\.g\. --optim"):
        will_it_fit(configs["llama"], "24GiB", optim="adam8bit")
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_OFFLINE", True)
    with pytest.raises(FitError, match="^remat: could not resolve the model name 'meta-llama/Meta-Llama-3-8B'") as e:
        will_it_fit("meta-llama/Meta-Llama-3-8B", "24GiB")
    assert "Fix: pass the path of the model's config.json" in str(e.value)


def test_lora_without_peft_says_to_install_it(configs, monkeypatch):
    monkeypatch.setitem(sys.modules, "peft", None)
    with pytest.raises(FitError, match=r"^remat: --lora 16 adds LoRA adapters with peft.*Fix: pip install peft"):
        will_it_fit(configs["llama"], "24GiB", lora=16)


def test_a_sequence_longer_than_bert_positions(configs):
    with pytest.raises(FitError, match=r"^remat: BertForMaskedLM's training step failed .* Fix: --seq 512 or shorter"):
        will_it_fit(configs["bert"], "24GiB", seq=1024)


def test_a_setting_the_config_lacks_is_named_with_the_fix(tmp_path):
    """A T5 config without `decoder_start_token_id` (the Hub's has it: T5 shifts its labels right from it) stopped
    with "the model's forward raised AttributeError ... check that the inputs match", inputs `remat fit` makes."""
    config = {"architectures": ["T5ForConditionalGeneration"], "model_type": "t5", "d_model": H, "d_kv": 32}
    config |= {"d_ff": I, "num_layers": 1, "num_heads": HEADS, "vocab_size": V}
    (tmp_path / "config.json").write_text(json.dumps(config))
    expected = r"^remat: T5ForConditionalGeneration's training step reads `decoder_start_token_id` from its config"
    with pytest.raises(FitError, match=expected) as e:
        will_it_fit(str(tmp_path), "24GiB", seq=64)
    assert 'Fix: add "decoder_start_token_id" to the config.json' in str(e.value)
    config["decoder_start_token_id"] = 0
    (tmp_path / "config.json").write_text(json.dumps(config))
    assert will_it_fit(str(tmp_path), "24GiB", seq=64).fits


def test_a_model_whose_code_fails_in_bf16_is_told_to_train_under_autocast(tmp_path):
    """XLNet adds a float32 tensor to its bf16 ones: the error said "its config allows at most -1 positions
    (max_position_embeddings). Fix: --seq -1 or shorter", from XLNet's -1, which bounds nothing."""
    config = {"architectures": ["XLNetForSequenceClassification"], "model_type": "xlnet", "d_model": 256, "n_layer": 1}
    config |= {"n_head": 4, "d_inner": 512, "vocab_size": 1024}
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(
        FitError, match=r"^remat: XLNetForSequenceClassification.s training step failed on a batch"
    ) as e:
        will_it_fit(str(tmp_path), "24GiB", seq=64, dtype="bf16")
    assert "its code does not run with its weights in bf16 (the error names that dtype). Fix: --dtype amp-bf16" in str(
        e.value
    )
    assert "-1" not in str(e.value) and "torch.bfloat16" in str(e.value)  # the model's own words, after "It said"
    assert will_it_fit(str(tmp_path), "24GiB", seq=64, dtype="amp-bf16", changes=()).fits
