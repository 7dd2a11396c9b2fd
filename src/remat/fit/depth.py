"""A config's depth: how many layers each stack builds, and a copy with fewer (`remat fit`'s estimate of a deep
model from two shallow ones, NOTE [A deep model from two shallow ones] in `remat.fit.estimate`)."""

from __future__ import annotations

BACKBONE = ("stage_names", "out_features", "out_indices")
DECODER_LAYERS = ("decoder_layers", "num_decoder_layers")  # an encoder-decoder's second stack (BART, T5)


def layer_keys(config) -> list[str]:
    """The fields of `config.to_dict()` that count each stack's layers: "num_hidden_layers" or the field the config
    keeps it in (GPT-2's "n_layer", T5's "num_layers", BART's "encoder_layers"), and an encoder-decoder's decoder's."""
    data = config.to_dict()
    alias = getattr(config, "attribute_map", {}).get("num_hidden_layers")
    first = [k for k in ("num_hidden_layers", alias, "encoder_layers") if k and isinstance(data.get(k), int)][:1]
    decoder = [k for k in DECODER_LAYERS if getattr(config, "is_encoder_decoder", False) and k in data]
    return first + [k for k in decoder if isinstance(data[k], int)][:1]


def stacks_of(config) -> list[int]:
    """How many layers each stack of the config builds: [32] for a Llama, [12, 12] for T5-base's encoder and
    decoder ([] where the config does not say in a field `layer_keys` knows)."""
    data = config.to_dict()
    return [data[k] for k in layer_keys(config) if data[k] > 0]


def layers_of(config) -> int | None:
    """The L of NOTE [A deep model from two shallow ones]: how many layers the config's one stack builds (None where
    it does not say, or for an encoder-decoder, whose least-memory plan its copies with 1 and 2 layers of each
    stack do not extrapolate: T5-base's, one rank of 8, is 1.73, 1.86, 1.91 and 2.38 GiB with 1, 2, 3 and 12)."""
    stacks = stacks_of(config)
    return stacks[0] if len(stacks) == 1 else None


def with_layers(config, layers: int):
    """A copy of `config` with `layers` layers in each stack (lists of one entry per layer cut to match)."""
    data = config.to_dict()
    keys = layer_keys(config)
    total = data[keys[0]]
    for key, value in data.items():
        if isinstance(value, list) and len(value) == total and key != "architectures":
            data[key] = value[:layers]
    data.update(dict.fromkeys(keys, layers))
    for key in BACKBONE:  # a vision config's backbone stages, named by layer (DINOv2's "stage24"): rebuilt from it
        data.pop(key, None)
    return type(config).from_dict(data)
