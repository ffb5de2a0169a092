"""How far quantized KV (`--kv-bits 8 | 4`) moves a model's log-probabilities, on fixed
prompts (issue 40, "quality").

`python -m docs.investigations.kv_quality --model DIR [--group 64] [--tokens 32]`: for each
prompt (text ones, and image ones on a vision-language model) the model's greedy answer with
full-precision KV is the reference; the same prompt and answer are then fed with KV held at
8 and at 4 bits (teacher forcing: the reference's tokens, whatever the quantized model would
pick), and each reference token's log-probability is compared: mean and max |delta|, and how
often the quantized model's own top token is the reference's (top-1 agreement). The prompt
goes in one forward, then one decode step per token, as the engine's rows decode.

Random weights make every logit a near-tie (log-probabilities all near -ln(vocab)), so they
bound the effect only loosely: a trained model's sharper distributions move differently.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence
from typing import Any

import mlx.core as mx
import numpy as np
from PIL import Image

from caches.hashing import pixel_hash
from gateway.api.openai.parse import parse_chat_request
from gateway.engine.families.registry import load_model
from gateway.engine.model.kv_check import enable_kv_quant
from gateway.engine.model.quant_kv import KVQuant
from gateway.frontend.prompt import PromptBuilder
from gateway.media import DecodedImage
from gateway.processors.positions import rope_delta_at

TEXT_PROMPTS = (
    "Write a short story about a lighthouse keeper who finds a message in a bottle.",
    "Explain, step by step, how a refrigerator moves heat out of its inside.",
    "List five things to check before a long bicycle trip, with one sentence on each.",
    "What are the trade-offs between a linked list and an array? Be concrete.",
    "Translate into plain English: 'the quick brown fox jumps over the lazy dog'.",
    "Summarise the rules of chess for someone who has never played a board game.",
)
IMAGE_PROMPTS = ("What is in this picture?", "Describe the colours.", "Count the shapes.")


def _image(seed: int, size: int) -> DecodedImage:
    rng = np.random.default_rng(seed)
    pixels = Image.fromarray(rng.integers(0, 256, (size, size, 3), dtype=np.uint8), "RGB")
    digest = pixel_hash("RGB", size, size, pixels.tobytes())
    return DecodedImage(pixels, digest, size, size, "data", 0.0, 0.0)


def _bodies(vision: bool, size: int) -> list[tuple[dict, list[DecodedImage]]]:
    base = {"model": "m", "temperature": 0, "max_tokens": 1}
    out = [({**base, "messages": [{"role": "user", "content": p}]}, []) for p in TEXT_PROMPTS]
    for i, question in enumerate(IMAGE_PROMPTS if vision else ()):
        image = {"type": "image_url", "image_url": {"url": "x"}}
        messages = [{"role": "user", "content": [image, {"type": "text", "text": question}]}]
        out.append(({**base, "messages": messages}, [_image(i, size)]))
    return out


def _answer(model: Any, request: Any, tokens: int, forced: Sequence[int] | None) -> tuple:
    """(token ids, their log-probabilities, the model's own top tokens): greedy, or the
    `forced` tokens fed whatever the model would pick."""
    ids, images = list(request.prompt_ids), request.images
    layouts = [i.layout for i in images]
    encoded = [
        model.encode_image(
            i.pixel_values if i.pixel_values is not None else model.preprocess(i.image)[0],
            i.grid_thw,
        )
        for i in images
    ]
    cache = model.new_cache()
    plan = model.prefill_plan(ids, layouts, encoded, 0, len(ids))
    logits = model.logits(model.prefill(plan, cache, 0, len(ids))[:, -1:])
    for layer in cache:
        layer.rope_delta = rope_delta_at(layouts, len(ids))
    chosen, logprobs, tops = [], [], []
    for step in range(tokens):
        row = logits[0, -1].astype(mx.float32)
        row = row - mx.logsumexp(row)
        top = int(mx.argmax(row).item())
        token = top if forced is None else forced[step]
        chosen.append(token)
        logprobs.append(float(row[token].item()))
        tops.append(top)
        logits = model.text_core(mx.array([[token]], dtype=mx.int32), cache=cache)
    return chosen, logprobs, tops


def measure(path: str, group: int, tokens: int, image_size: int) -> dict[str, dict]:
    model = load_model(path)
    vision = bool(model.media)
    enable_kv_quant(model, KVQuant(8, group))  # refuses a model it does not cover
    model.kv_quant = None
    builder = PromptBuilder(model, 8192, 16)
    requests = [
        builder.build(parse_chat_request(body), images, f"q{i}", time.perf_counter())
        for i, (body, images) in enumerate(_bodies(vision, image_size))
    ]
    reference = [_answer(model, r, tokens, None) for r in requests]
    out = {}
    for bits in (8, 4):
        model.kv_quant = KVQuant(bits, group)
        deltas, agree = [], []
        for request, (ids, lps, _) in zip(requests, reference, strict=True):
            _, quant_lps, tops = _answer(model, request, tokens, ids)
            deltas += [abs(a - b) for a, b in zip(lps, quant_lps, strict=True)]
            agree += [t == i for t, i in zip(tops, ids, strict=True)]
        out[f"{bits}-bit"] = {
            "mean_abs_delta": float(np.mean(deltas)),
            "max_abs_delta": float(np.max(deltas)),
            "top1_agreement": float(np.mean(agree)),
            "tokens": len(deltas),
            "mean_logprob": float(np.mean([lp for _, lps, _ in reference for lp in lps])),
        }
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--group", type=int, default=64, help="--kv-group-size")
    parser.add_argument("--tokens", type=int, default=32, help="answer tokens per prompt")
    parser.add_argument("--image-size", type=int, default=224)
    args = parser.parse_args()
    started = time.perf_counter()
    for name, row in measure(args.model, args.group, args.tokens, args.image_size).items():
        print(name, " ".join(f"{k}={v:.6g}" for k, v in row.items()))
    print(f"({time.perf_counter() - started:.1f} s)")


if __name__ == "__main__":
    main()
