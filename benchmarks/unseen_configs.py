"""The Hugging Face configurations `unseen_models.py` builds (and `cpu_nondeterminism.py` borrows): small enough
for a CPU step in seconds, each an architecture remat's tests do not build."""

from __future__ import annotations

TEXT = dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=3, num_attention_heads=4)
DECODER = dict(TEXT, max_position_embeddings=64)
VIT = dict(image=32, image_size=32, patch_size=8, hidden_size=64, num_hidden_layers=3, num_attention_heads=4)
SEQ2SEQ = dict(  # an encoder-decoder's two stacks (BART, Whisper)
    vocab_size=256,
    d_model=64,
    encoder_layers=2,
    decoder_layers=2,
    encoder_attention_heads=4,
    decoder_attention_heads=4,
    encoder_ffn_dim=128,
    decoder_ffn_dim=128,
)
REFORMER = dict(
    vocab_size=256,
    hidden_size=64,
    num_attention_heads=2,
    attention_head_size=32,
    feed_forward_size=128,
    axial_pos_embds=False,
    attn_layers=["local", "lsh", "local"],
    local_attn_chunk_length=16,
    lsh_attn_chunk_length=16,
    num_buckets=2,
    max_position_embeddings=64,
    is_decoder=True,
)
MODELS: dict[str, tuple[str, str, dict]] = {
    "mistral": ("MistralConfig", "MistralForCausalLM", dict(DECODER, num_key_value_heads=2)),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", dict(DECODER, num_key_value_heads=1)),
    "gemma": ("GemmaConfig", "GemmaForCausalLM", dict(DECODER, num_key_value_heads=1, head_dim=16)),
    "phi": ("PhiConfig", "PhiForCausalLM", DECODER),
    "gpt_neox": ("GPTNeoXConfig", "GPTNeoXForCausalLM", DECODER),
    "opt": (
        "OPTConfig",
        "OPTForCausalLM",
        dict(
            vocab_size=256,
            hidden_size=64,
            ffn_dim=128,
            num_hidden_layers=3,
            num_attention_heads=4,
            max_position_embeddings=64,
            word_embed_proj_dim=64,
        ),
    ),
    "bloom": ("BloomConfig", "BloomForCausalLM", dict(vocab_size=256, hidden_size=64, n_layer=3, n_head=4)),
    "falcon": (
        "FalconConfig",
        "FalconForCausalLM",
        dict(vocab_size=256, hidden_size=64, num_hidden_layers=3, num_attention_heads=4),
    ),
    "qwen3_moe": (
        "Qwen3MoeConfig",
        "Qwen3MoeForCausalLM",
        dict(DECODER, num_key_value_heads=2, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=64),
    ),
    "mixtral": (
        "MixtralConfig",
        "MixtralForCausalLM",
        dict(DECODER, num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2),
    ),
    "gpt_bigcode": (  # multi-query attention
        "GPTBigCodeConfig",
        "GPTBigCodeForCausalLM",
        dict(vocab_size=256, n_embd=64, n_layer=3, n_head=4, n_positions=64, multi_query=True),
    ),
    "gemma2": (  # logit soft-capping, a sliding window on alternate layers, norms after each sublayer too
        "Gemma2Config",
        "Gemma2ForCausalLM",
        dict(
            DECODER,
            num_key_value_heads=2,
            head_dim=16,
            sliding_window=16,
            attn_logit_softcapping=50.0,
            final_logit_softcapping=30.0,
        ),
    ),
    "olmo2": ("Olmo2Config", "Olmo2ForCausalLM", dict(DECODER, num_key_value_heads=2)),  # norms after, q/k normed
    "starcoder2": ("Starcoder2Config", "Starcoder2ForCausalLM", dict(DECODER, num_key_value_heads=2)),
    "gptj": (  # attention and MLP in parallel off one norm; rotary on part of each head
        "GPTJConfig",
        "GPTJForCausalLM",
        dict(vocab_size=256, n_embd=64, n_layer=3, n_head=4, n_positions=64, rotary_dim=8),
    ),
    "mpt": ("MptConfig", "MptForCausalLM", dict(vocab_size=256, d_model=64, n_layers=3, n_heads=4, max_seq_len=64)),
    "stablelm": (
        "StableLmConfig",
        "StableLmForCausalLM",
        dict(DECODER, num_key_value_heads=2, partial_rotary_factor=0.25),
    ),
    "mamba": (  # state-space: on CPU a loop over the sequence, and a SiLU module made inside the forward
        "MambaConfig",
        "MambaForCausalLM",
        dict(vocab_size=256, hidden_size=64, num_hidden_layers=3, state_size=8),
    ),
    "qwen3_5": (  # hybrid: three gated-delta-rule (linear attention) layers, then one of full attention
        "Qwen3_5TextConfig",
        "Qwen3_5ForCausalLM",
        dict(
            DECODER,
            num_hidden_layers=4,
            num_key_value_heads=2,
            head_dim=16,
            linear_num_key_heads=2,
            linear_num_value_heads=4,
            linear_key_head_dim=16,
            linear_value_head_dim=16,
            layer_types=["linear_attention"] * 3 + ["full_attention"],
        ),
    ),
    "gemma3": (
        "Gemma3TextConfig",
        "Gemma3ForCausalLM",
        dict(DECODER, num_key_value_heads=2, head_dim=16, sliding_window=16),
    ),
    "gpt_oss": (  # experts with biases, gathered per token (a backward that sums in any order); attention sinks
        "GptOssConfig",
        "GptOssForCausalLM",
        dict(
            DECODER, num_key_value_heads=2, head_dim=16, num_local_experts=4, num_experts_per_tok=2, sliding_window=16
        ),
    ),
    "deepseek_v3": (  # latent attention (low-rank q and kv), a dense first layer, then routed experts
        "DeepseekV3Config",
        "DeepseekV3ForCausalLM",
        dict(
            DECODER,
            num_key_value_heads=2,
            moe_intermediate_size=32,
            n_routed_experts=4,
            num_experts_per_tok=2,
            n_group=1,
            topk_group=1,
            first_k_dense_replace=1,
            kv_lora_rank=16,
            q_lora_rank=32,
            qk_rope_head_dim=8,
            qk_nope_head_dim=8,
            v_head_dim=16,
        ),
    ),
    "lfm2": ("Lfm2Config", "Lfm2ForCausalLM", dict(DECODER, num_key_value_heads=2, full_attn_idxs=[1])),  # short convs
    "mamba2": (
        "Mamba2Config",
        "Mamba2ForCausalLM",
        dict(vocab_size=256, hidden_size=64, num_hidden_layers=3, state_size=8, head_dim=16, num_heads=8, n_groups=1),
    ),
    "reformer": ("ReformerConfig", "ReformerModelWithLMHead", REFORMER),  # reversible layers; torch.seed() in them
    "reformer_seeded": (  # the same, with its random draws fixed: dropout 0 and a hashing seed
        "ReformerConfig",
        "ReformerModelWithLMHead",
        dict(
            REFORMER,
            hash_seed=0,
            hidden_dropout_prob=0.0,
            attention_probs_dropout_prob=0.0,
            lsh_attention_probs_dropout_prob=0.0,
            local_attention_probs_dropout_prob=0.0,
        ),
    ),
    "longformer": (  # checks its inputs' padding (a data-dependent op: NOTE [Values a fake step can know])
        "LongformerConfig",
        "LongformerForMaskedLM",
        dict(TEXT, attention_window=[8, 8, 8], max_position_embeddings=72),
    ),
    "wav2vec2": (  # CTC: targets selected by `labels >= 0`; LayerDrop off (a random branch: a fake step cannot know it)
        "Wav2Vec2Config",
        "Wav2Vec2ForCTC",
        dict(
            audio=4000,
            vocab_size=32,
            hidden_size=64,
            num_hidden_layers=3,
            num_attention_heads=4,
            intermediate_size=128,
            conv_dim=(32, 32),
            conv_stride=(5, 2),
            conv_kernel=(10, 3),
            num_conv_pos_embeddings=16,
            num_conv_pos_embedding_groups=4,
            layerdrop=0.0,
            mask_time_prob=0.0,  # SpecAugment draws with numpy: the step would not replay itself for verify
        ),
    ),
    "roberta": ("RobertaConfig", "RobertaForMaskedLM", dict(TEXT, max_position_embeddings=72)),
    "distilbert": (
        "DistilBertConfig",
        "DistilBertForMaskedLM",
        dict(vocab_size=256, dim=64, hidden_dim=128, n_layers=3, n_heads=4),
    ),
    "electra": ("ElectraConfig", "ElectraForMaskedLM", dict(TEXT, embedding_size=32)),
    "deberta_v2": ("DebertaV2Config", "DebertaV2ForMaskedLM", TEXT),
    "xlm_roberta": ("XLMRobertaConfig", "XLMRobertaForMaskedLM", dict(TEXT, max_position_embeddings=72)),
    "funnel": (  # pools the sequence between blocks
        "FunnelConfig",
        "FunnelForMaskedLM",
        dict(vocab_size=256, d_model=64, n_head=4, d_head=16, d_inner=128, block_sizes=[1, 1, 1]),
    ),
    "bart": ("BartConfig", "BartForConditionalGeneration", dict(SEQ2SEQ, max_position_embeddings=64)),
    "t5": (  # relative position bias, an encoder-decoder
        "T5Config",
        "T5ForConditionalGeneration",
        dict(vocab_size=256, d_model=64, d_kv=16, d_ff=128, num_layers=2, num_heads=4, decoder_start_token_id=0),
    ),
    "whisper": (  # speech seq2seq: 2 clips' log-mel frames (2 x max_source_positions of them), 20 labels each
        "WhisperConfig",
        "WhisperForConditionalGeneration",
        dict(
            SEQ2SEQ,
            features=16,
            num_mel_bins=16,
            max_source_positions=64,
            max_target_positions=32,
            pad_token_id=0,
            bos_token_id=1,
            eos_token_id=1,
            decoder_start_token_id=2,
        ),
    ),
    "convnext": (
        "ConvNextConfig",
        "ConvNextForImageClassification",
        dict(image=64, hidden_sizes=[16, 32, 64, 64], depths=[1, 1, 2, 1]),
    ),
    "regnet": (
        "RegNetConfig",
        "RegNetForImageClassification",
        dict(image=64, embedding_size=16, hidden_sizes=[16, 32, 64, 64], depths=[1, 1, 1, 1], groups_width=8),
    ),
    "resnet": (
        "ResNetConfig",
        "ResNetForImageClassification",
        dict(image=64, embedding_size=16, hidden_sizes=[16, 32, 64, 64], depths=[1, 1, 1, 1]),
    ),
    "mobilenet_v2": ("MobileNetV2Config", "MobileNetV2ForImageClassification", dict(image=64, depth_multiplier=0.35)),
    "swin": (
        "SwinConfig",
        "SwinForImageClassification",
        dict(image=32, image_size=32, patch_size=4, embed_dim=16, depths=[1, 1], num_heads=[2, 2], window_size=4),
    ),
    "deit": ("DeiTConfig", "DeiTForImageClassification", dict(VIT, intermediate_size=128)),
    "dinov2": ("Dinov2Config", "Dinov2ForImageClassification", dict(VIT, mlp_ratio=2)),  # layer scale
    "segformer": (  # hierarchical transformer with overlapping patch embeddings and reduced-key attention
        "SegformerConfig",
        "SegformerForImageClassification",
        dict(image=64, hidden_sizes=[16, 32, 64, 64], depths=[1, 1, 1, 1], num_attention_heads=[1, 2, 4, 4]),
    ),
}
