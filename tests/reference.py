"""The reference implementation's greedy answer, to compare the gateway's against.

    reference_generate(model_dir, messages, images, max_tokens) -> ReferenceOutput

runs a checkpoint's own library end to end, the way its users would without the gateway:

- vision-language checkpoints (config.json has a `vision_config`): `mlx_vlm.load`, mlx-vlm's
  `prompt_utils.apply_chat_template` over `messages` (with `num_images=len(images)`), and
  `mlx_vlm.stream_generate` at temperature 0 over the images;
- text checkpoints: `mlx_lm.load`, the tokenizer's `apply_chat_template(messages,
  add_generation_prompt=True)` (mlx-lm's defaults, so Qwen3 thinks), and
  `mlx_lm.stream_generate` with the greedy sampler.

It returns the prompt ids the reference fed its model, the generated ids and each one's
log-probability under the reference's own logits (the library's log-softmax, as a Python
float of the model's dtype), without the end-of-turn token when it stopped on one
(`finish_reason` "stop"; "length" when it made `max_tokens` ids). Loaded models are cached per
directory and build (a rebuilt checkpoint is loaded again); everything runs on the calling
thread. This module only serves tests: the product never imports it.

Known reference behaviour (mlx-vlm 0.7.10): for gemma3 and mistral3 prompts, and gemma4
prompts with images, the processor encodes the rendered template with special tokens, so its
ids start with two BOS tokens (the template writes one, the tokenizer's post-processor adds
another). The checkpoints were trained with one (the template's, as transformers renders it),
and the gateway sends one, so by default (`single_bos=True`) the reference is run on the same
input: the ids mlx-vlm prepares, less the duplicated leading BOS, fed to mlx-vlm's own
`stream_generate` as prepared inputs (its documented `input_ids`/`pixel_values`/`mask`
keywords); `single_bos=False` runs it exactly as mlx-vlm would. Mistral 3's template names
today's date.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from PIL import Image

ImageLike = str | Path | Image.Image


@dataclass(frozen=True)
class ReferenceOutput:
    """One greedy answer of the reference implementation.

    `prompt_ids`: the ids the model was prefilled with (images expanded); `prompt`: the
    rendered template text; `token_ids` / `logprobs`: the answer, one natural-log
    probability per id; `finish_reason`: "stop" (an end id came; it is not in `token_ids`)
    or "length".
    """

    prompt: str
    prompt_ids: tuple[int, ...]
    token_ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    finish_reason: str


def is_vision_checkpoint(model_dir: Path) -> bool:
    """True for a checkpoint mlx-vlm loads (its config.json has a vision tower)."""
    config = json.loads((Path(model_dir) / "config.json").read_text(encoding="utf-8"))
    return bool(config.get("vision_config"))


def _build_stamp(model_dir: Path) -> tuple[int, int]:
    config = Path(model_dir) / "config.json"
    marker = Path(model_dir) / "vision_gateway_build.json"
    stat = (marker if marker.exists() else config).stat()
    return stat.st_mtime_ns, stat.st_size


@functools.lru_cache(maxsize=8)
def _load(model_dir: str, stamp: tuple[int, int]) -> tuple[Any, Any]:
    del stamp  # part of the cache key only: a rebuilt checkpoint is loaded again
    if is_vision_checkpoint(Path(model_dir)):
        import mlx_vlm

        return mlx_vlm.load(model_dir)
    import mlx_lm

    return mlx_lm.load(model_dir)


def load_reference(model_dir: Path) -> tuple[Any, Any]:
    """(model, processor or tokenizer) as the reference library loads them, cached."""
    path = Path(model_dir).resolve()
    return _load(str(path), _build_stamp(path))


def _text_generate(
    model: Any, tokenizer: Any, messages: list[dict[str, Any]], max_tokens: int
) -> ReferenceOutput:
    import mlx_lm
    from mlx_lm.sample_utils import make_sampler

    prompt = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    prompt_ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True)
    ids: list[int] = []
    logprobs: list[float] = []
    finish = "length"
    steps = mlx_lm.stream_generate(
        model, tokenizer, prompt_ids, max_tokens=max_tokens, sampler=make_sampler(0.0)
    )
    for step in steps:
        # mlx-lm yields each id once, except that its last response repeats nothing: it is
        # the max_tokens-th id ("length") or the end id it stopped on ("stop").
        if step.finish_reason == "stop":
            finish = "stop"
            break
        ids.append(int(step.token))
        logprobs.append(float(step.logprobs[step.token].item()))
    return ReferenceOutput(prompt, tuple(prompt_ids), tuple(ids), tuple(logprobs), finish)


def _drop_duplicate_bos(processor: Any, input_ids: Any, mask: Any) -> tuple[Any, Any]:
    """`input_ids` (1, n) without its first id when the first two are both BOS (and `mask`
    likewise); unchanged otherwise."""
    tokenizer = getattr(processor, "tokenizer", processor)
    bos = tokenizer.bos_token_id
    first = input_ids[0, :2].tolist()
    if bos is None or first != [bos, bos]:
        return input_ids, mask
    return input_ids[:, 1:], None if mask is None else mask[:, 1:]


def _drop_first(value: Any, length: int, key: str = "") -> Any:
    """A (1, length, ...) per-token array without its first entry; anything else as is
    (audio features are per frame, whatever their count)."""
    if key.startswith("input_features"):
        return value
    shape = getattr(value, "shape", ())
    if len(shape) >= 2 and shape[0] == 1 and shape[1] == length:
        return value[:, 1:]
    return value


def _vision_generate(
    model: Any,
    processor: Any,
    messages: list[dict[str, Any]],
    images: list[Any],
    max_tokens: int,
    single_bos: bool,
    template_kwargs: dict[str, Any],
    audio: list[Any],
) -> ReferenceOutput:
    import mlx_vlm
    from mlx_vlm.generate.dispatch import _prepare_generation_inputs
    from mlx_vlm.prompt_utils import apply_chat_template

    if audio:
        template_kwargs = {**template_kwargs, "num_audios": len(audio)}
    prompt = apply_chat_template(
        processor, model.config, messages, num_images=len(images), **template_kwargs
    )
    # The inputs stream_generate prepares for itself (the same call, made here), handed back to
    # it as caller-prepared tensors: the one way to correct the duplicated BOS.
    input_ids, pixel_values, mask, extra = _prepare_generation_inputs(
        model, processor, prompt, images or None, audio or None, None, {}
    )
    if single_bos:
        length = input_ids.shape[1]
        input_ids, mask = _drop_duplicate_bos(processor, input_ids, mask)
        if input_ids.shape[1] < length:
            # The per-token inputs the processor made along the ids lose the same first entry
            # (Gemma 4's `mm_token_type_ids`: left one longer than the ids, mlx-vlm silently
            # drops its bidirectional image mask, which the checkpoint was trained with).
            extra = {k: _drop_first(v, length, k) for k, v in extra.items()}
    prompt_ids = tuple(int(t) for t in input_ids[0].tolist())
    ids: list[int] = []
    logprobs: list[float] = []
    final = None
    steps = mlx_vlm.stream_generate(
        model,
        processor,
        prompt,
        image=images or None,
        audio=audio or None,
        max_tokens=max_tokens,
        temperature=0.0,
        input_ids=input_ids,
        pixel_values=pixel_values,
        mask=mask,
        **extra,
    )
    for step in steps:
        if step.finish_reason is not None:  # a summary repeating the last id (or the end id)
            final = step
            break
        ids.append(int(step.token))
        logprobs.append(float(step.logprobs[step.token].item()))
    assert final is not None and final.prompt_tokens == len(prompt_ids)
    finish = final.finish_reason
    expected = list(final.token_ids[:-1] if finish == "stop" else final.token_ids)
    assert ids == expected, (ids, final.token_ids)
    return ReferenceOutput(prompt, prompt_ids, tuple(ids), tuple(logprobs), finish)


def reference_generate(
    model_dir: Path,
    messages: list[dict[str, Any]],
    images: Sequence[ImageLike] = (),
    max_tokens: int = 16,
    single_bos: bool = True,
    template_kwargs: dict[str, Any] | None = None,
    audio: Sequence[Any] = (),
) -> ReferenceOutput:
    """The reference library's greedy answer to `messages` (OpenAI-style dicts; image parts
    as {"type": "image"}) with `images` (paths or PIL images, in prompt order).

    `single_bos`: run a vision checkpoint on its prompt with one leading BOS (see the module
    docstring); False: exactly as mlx-vlm would. Raises ValueError for images sent to a text
    checkpoint or a max_tokens below 1. `template_kwargs`: extra chat-template variables for
    a vision checkpoint (mlx-vlm renders with `enable_thinking=False` unless told otherwise;
    the gateway renders the template's defaults, so a thinking template's test passes
    `{"enable_thinking": True}`). `audio`: mono float32 clips at the model's rate (numpy),
    in prompt order (mlx-vlm's template helper puts them after the message's text).
    """
    if max_tokens < 1:
        raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
    model, processor = load_reference(Path(model_dir))
    if not is_vision_checkpoint(Path(model_dir)):
        if images:
            raise ValueError(f"{model_dir} is a text model: it takes no images")
        return _text_generate(model, processor, messages, max_tokens)
    loaded = [str(i) if isinstance(i, Path) else i for i in images]
    kwargs = dict(template_kwargs or {})
    return _vision_generate(
        model, processor, messages, loaded, max_tokens, single_bos, kwargs, list(audio)
    )
