"""Gemma 3n (`--arch gemma3n`, E2B-style), loaded by mlx-vlm: shapes, tokenizer, processor.

Structure kept from gemma-3n-E2B-it at tiny sizes:
- language model: 10 layers in 3n's 4 sliding : 1 full pattern, of which the last 4 reuse the
  KV of the last earlier layer of their type (`num_kv_shared_layers`), so `make_cache()` gives
  6 caches for 10 layers; AltUp (4 streams), Laurel blocks, per-layer input embeddings
  (`hidden_size_per_layer_input`), activation sparsity (top-k GELU) on the first layers as
  upstream's first 10; a 48-token window; final logit soft-capping 30; tied embeddings;
- vocabulary: the text ids, then a vision block and an audio block (`vocab_offset`s), as
  upstream's 262144 + 128 + 128: `<end_of_image>` and `<image_soft_token>` are the vision
  block's first two ids, `<end_of_audio>` and `<audio_soft_token>` the audio block's (their
  input embeddings come from `embed_vision` / `embed_audio`, their per-layer inputs are id 0);
- vision: mlx-vlm 0.7.10's MobileNetV5 tower is not configurable (its block list, widths and
  the 2048-wide, 16 x 16 output are written in `gemma3n/vision.py`), so this checkpoint holds
  the full tower (294 M parameters, about 1.2 GB in float32): 256 soft tokens per image
  whatever its size; the image processor resizes to 256 x 256 (upstream: 768), the smallest
  side the tower's fusion adapter takes (a 16 x 16 stage-3 grid; below it mlx-vlm's bicubic
  path fails). Its CPU cost is tens of seconds per image;
- prompt: an image part renders as `<image_soft_token>`, which the processor replaces by
  `\\n\\n<start_of_image>` + 256 x `<image_soft_token>` + `<end_of_image>\\n\\n`;
- audio: a Conformer audio tower at tiny widths (`audio_config`), with upstream's feature
  extractor settings; a clip becomes 188 soft tokens (`audio_soft_tokens_per_image`);
- tokenizer: SentencePiece-style BPE with byte fallback (GemmaTokenizer), `<bos>` added by the
  post-processor, `<end_of_turn>` ends a turn.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer

from .bpe import Special, TokenizerSpec, build_tokenizer
from .chat_templates import gemma3n as template
from .family import Family
from .tokenizer_files import dump_json, write_tokenizer_files

TEXT_VOCAB = 2048  # ids with a text embedding row of their own (vocab_size_per_layer_input)
MEDIA_VOCAB = 32  # each of the vision and audio blocks after them (upstream: 128 each)
VOCAB_SIZE = TEXT_VOCAB + 2 * MEDIA_VOCAB
VISION_OFFSET = TEXT_VOCAB
AUDIO_OFFSET = TEXT_VOCAB + MEDIA_VOCAB
# Control tokens at the low ids (the BPE's layout), then those upstream keeps in the media
# blocks, at their upstream place in the block (the end marker first, the soft token next).
LOW_TOKENS: tuple[str, ...] = (
    "<pad>",
    "<eos>",
    "<bos>",
    "<unk>",
    "<mask>",
    "[multimodal]",
    "<start_of_turn>",
    "<end_of_turn>",
    "<start_of_image>",
    "<start_of_audio>",
)
BLOCK_TOKENS: dict[str, int] = {
    "<end_of_image>": VISION_OFFSET,
    "<image_soft_token>": VISION_OFFSET + 1,
    "<end_of_audio>": AUDIO_OFFSET,
    "<audio_soft_token>": AUDIO_OFFSET + 1,
}
MEDIA_TOKENS = {
    "boi_token": "<start_of_image>",
    "eoi_token": "<end_of_image>",
    "image_token": "<image_soft_token>",
    "boa_token": "<start_of_audio>",
    "eoa_token": "<end_of_audio>",
    "audio_token": "<audio_soft_token>",
}
IMAGE_SIDE = 256  # px; 16 x 16 at the tower's stage 3 (module doc)
IMAGE_TOKENS = 256  # the tower's fixed 16 x 16 output
AUDIO_TOKENS = 188  # upstream's `audio_soft_tokens_per_image`
VISION_HIDDEN = 2048  # fixed by mlx-vlm's tower
SLIDING_WINDOW = 48
LAYER_TYPES = (["sliding_attention"] * 4 + ["full_attention"]) * 2
# Upstream E2B: 0.95 on its first 10 of 30 layers; here on the first 2 of 10.
SPARSITY = [0.95] * 2 + [0.0] * (len(LAYER_TYPES) - 2)
_TEXT = dict(
    hidden_size=64,
    num_hidden_layers=len(LAYER_TYPES),
    num_kv_shared_layers=4,
    intermediate_size=[128] * len(LAYER_TYPES),
    num_attention_heads=4,
    num_key_value_heads=1,
    head_dim=16,
    hidden_size_per_layer_input=16,
    laurel_rank=8,
    altup_num_inputs=4,
    altup_active_idx=0,
    altup_coef_clip=120.0,
    altup_correct_scale=True,
)
_AUDIO = dict(
    input_feat_size=128,
    hidden_size=32,
    conf_attention_chunk_size=12,
    conf_attention_context_left=13,
    conf_attention_context_right=0,
    conf_attention_invalid_logits_value=-1e9,
    conf_attention_logit_cap=50.0,
    conf_num_attention_heads=2,
    conf_num_hidden_layers=2,
    conf_conv_kernel_size=5,
    conf_positional_bias_size=256,
    conf_reduction_factor=4,
    conf_residual_weight=0.5,
    sscp_conv_channel_size=[8, 4],
    sscp_conv_group_norm_eps=1e-3,
    sscp_conv_kernel_size=[[3, 3], [3, 3]],
    sscp_conv_stride_size=[[2, 2], [2, 2]],
    sscp_conv_eps=1e-3,
    rms_norm_eps=1e-6,
    gradient_clipping=1e10,
)
# Gemma 3n's feature extractor (upstream's preprocessor_config.json, audio part).
FEATURE_EXTRACTOR = {
    "feature_extractor_type": "Gemma3nAudioFeatureExtractor",
    "feature_size": 128,
    "sampling_rate": 16000,
    "padding_value": 0.0,
    "padding_side": "right",
    "return_attention_mask": True,
    "frame_length_ms": 32.0,
    "hop_length_ms": 10.0,
    "min_frequency": 125.0,
    "max_frequency": 7600.0,
    "preemphasis": 0.97,
    "preemphasis_htk_flavor": True,
    "fft_overdrive": True,
    "dither": 0.0,
    "input_scale_factor": 1.0,
    "mel_floor": 1e-5,
    "per_bin_mean": None,
    "per_bin_stddev": None,
}


def spec() -> TokenizerSpec:
    specials = (*LOW_TOKENS, *BLOCK_TOKENS)
    return TokenizerSpec(
        style="gemma",
        specials=tuple(Special(t) for t in specials),
        vocab_size=VOCAB_SIZE,
        trained=TEXT_VOCAB - len(specials),
        specials_first=True,
        bos="<bos>",
        add_bos=True,
    )


def _relocated(tok: Tokenizer, moves: dict[str, int]) -> Tokenizer:
    """`tok` with each token of `moves` at its given id, swapped with the filler word there
    (fillers are never encoded, so only those ids change)."""
    raw = json.loads(tok.to_str())
    vocab: dict[str, int] = raw["model"]["vocab"]
    by_id = {i: t for t, i in vocab.items()}
    for token, target in moves.items():
        source, other = vocab[token], by_id[target]
        vocab[token], vocab[other] = target, source
        by_id[target], by_id[source] = token, other
    for added in raw["added_tokens"]:
        added["id"] = vocab.get(added["content"], added["id"])
    raw["added_tokens"].sort(key=lambda a: a["id"])
    out = Tokenizer.from_str(json.dumps(raw))
    moved = {t: out.token_to_id(t) for t in moves}
    if moved != moves or out.get_vocab_size(with_added_tokens=True) != VOCAB_SIZE:
        raise RuntimeError(f"tokenizer layout broken: {moved}")
    return out


def _write_tokenizer(out: Path) -> dict[str, int]:
    tok = _relocated(build_tokenizer(spec()), BLOCK_TOKENS)
    config = {
        "add_bos_token": True,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "extra_special_tokens": MEDIA_TOKENS,
        **MEDIA_TOKENS,
        "model_max_length": 32768,
        "padding_side": "left",
        "processor_class": "Gemma3nProcessor",
        "spaces_between_special_tokens": False,
        "tokenizer_class": "GemmaTokenizer",
        "use_default_system_prompt": False,
    }
    named = {"bos_token": "<bos>", "eos_token": "<eos>", "pad_token": "<pad>", "unk_token": "<unk>"}
    write_tokenizer_files(out, tok, config, named, template.TEMPLATE)
    return {t: tok.token_to_id(t) for t in (*LOW_TOKENS, *BLOCK_TOKENS)}


def _preprocessor() -> dict[str, Any]:
    """preprocessor_config.json: the image processor's settings (upstream's SigLIP ones at a
    256 px square) and the feature extractor's, as upstream ships both in one file."""
    return {
        "image_processor_type": "SiglipImageProcessor",
        "do_convert_rgb": None,
        "do_normalize": False,
        "do_rescale": True,
        "do_resize": True,
        "image_mean": [0.0, 0.0, 0.0],
        "image_std": [1.0, 1.0, 1.0],
        "resample": 2,
        "rescale_factor": 1 / 255,
        "size": {"height": IMAGE_SIDE, "width": IMAGE_SIDE},
        **FEATURE_EXTRACTOR,
        "processor_class": "Gemma3nProcessor",
    }


def write_files(out: Path, size: str, dtype: str) -> dict[str, Any]:
    """Tokenizer files, config.json, generation_config.json, preprocessor_config.json and
    processor_config.json; returns the config."""
    del size  # one size: tiny
    ids = _write_tokenizer(out)
    ends = [ids["<eos>"], ids["<end_of_turn>"]]
    text = {
        "model_type": "gemma3n_text",
        **_TEXT,
        "vocab_size": VOCAB_SIZE,
        "vocab_size_per_layer_input": TEXT_VOCAB,
        "layer_types": LAYER_TYPES,
        "sliding_window": SLIDING_WINDOW,
        "activation_sparsity_pattern": SPARSITY,
        "rope_theta": 1_000_000.0,
        "rope_local_base_freq": 10_000.0,
        "rope_scaling": None,
        "final_logit_softcapping": 30.0,
        "hidden_activation": "gelu_pytorch_tanh",
        "rms_norm_eps": 1e-6,
        "max_position_embeddings": 32768,
        "attention_bias": False,
        "attention_dropout": 0.0,
        "pad_token_id": ids["<pad>"],
    }
    vision = {
        "model_type": "gemma3n_vision",
        "architecture": "mobilenetv5_300m_enc",
        "hidden_size": VISION_HIDDEN,
        "vocab_size": MEDIA_VOCAB,
        "vocab_offset": VISION_OFFSET,
        "rms_norm_eps": 1e-6,
        "do_pooling": False,
    }
    audio = {
        "model_type": "gemma3n_audio",
        **_AUDIO,
        "vocab_size": MEDIA_VOCAB,
        "vocab_offset": AUDIO_OFFSET,
    }
    config = {
        "architectures": ["Gemma3nForConditionalGeneration"],
        "model_type": "gemma3n",
        "image_token_id": ids["<image_soft_token>"],
        "boi_token_id": ids["<start_of_image>"],
        "eoi_token_id": ids["<end_of_image>"],
        "audio_token_id": ids["<audio_soft_token>"],
        "boa_token_id": ids["<start_of_audio>"],
        "eoa_token_id": ids["<end_of_audio>"],
        "vision_soft_tokens_per_image": IMAGE_TOKENS,
        "audio_soft_tokens_per_image": AUDIO_TOKENS,
        "eos_token_id": ends,
        "pad_token_id": ids["<pad>"],
        "initializer_range": 0.02,
        "text_config": text,
        "vision_config": vision,
        "audio_config": audio,
        "torch_dtype": dtype,
    }
    dump_json(out / "config.json", config)
    # Ids only: sampling defaults are left to the server.
    generation = {"bos_token_id": ids["<bos>"], "eos_token_id": ends, "pad_token_id": ids["<pad>"]}
    dump_json(out / "generation_config.json", generation)
    dump_json(out / "preprocessor_config.json", _preprocessor())
    dump_json(
        out / "processor_config.json",
        {
            "image_seq_length": IMAGE_TOKENS,
            "audio_seq_length": AUDIO_TOKENS,
            "processor_class": "Gemma3nProcessor",
        },
    )
    return config


FAMILY = Family("gemma3n", "mlx-vlm", ("tiny",), "Gemma 3n, E2B-style (mlx-vlm)", write_files)
