"""What one request wants from the disk tier (`ReadPlan`), and the checks that turn a file
read back into something the request can use (`ReadBlock`, `ReadFeatures`).

The engine thread builds a plan when a request arrives (cheap: the blocks' keys and what each
must say, the images the memory cache lacks); the reader (gateway/engine/disk/reader.py)
reads and checks the files off the engine thread; at admission the engine thread only copies
the checked tensors into MLX arrays (gateway/engine/disk/kv.py, disk_tier.py).

A file that fails a check here does not fit the request (another prompt's block under a
colliding key, a stale rope delta, other shapes): the caller removes it and the read stops,
a miss, exactly as for a damaged file. No MLX, no I/O; pure functions on immutable values.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass

from caches.disk_format import RawTensor

# The arrays of one quantized keys or values tensor (`mx.quantize`'s triple), by file name.
QUANT_PARTS = ("q", "scales", "biases")
KVTensors = RawTensor | tuple[RawTensor, ...]  # one layer's keys or values (a triple: quantized)


def tensor_names(kind: str, layer: int, quantized: bool) -> list[str]:
    """The file tensors holding layer `layer`'s keys (`kind` "k") or values ("v")."""
    base = f"{kind}.{layer}"
    return [f"{base}.{p}" for p in QUANT_PARTS] if quantized else [base]


@dataclass(frozen=True)
class BlockWant:
    """KV block `index` of the prompt: its file `key`, the key items it must hold and the rope
    delta after it."""

    index: int
    key: str
    items: tuple[int | str, ...]
    rope_delta: int


@dataclass(frozen=True)
class ImageWant:
    """An image's features: its file `key`, the prompt token where its run ends (`end`), and
    what the file must say: pixel hash, token count, grid, dtype (safetensors name)."""

    key: str
    end: int
    pixel_hash: str
    num_tokens: int
    grid_thw: tuple[int, ...]
    dtype: str


@dataclass(frozen=True)
class ReadPlan:
    """Blocks to read in order (consecutive indices, stopping at the first missing or unfit
    one), of `block_tokens` tokens and `layers` layers; then the features of each image of
    `images` whose run ends past what the memory hit (`covered`, tokens) and the blocks read
    cover. Empty (`bool` False) when there is nothing to read."""

    blocks: tuple[BlockWant, ...]
    block_tokens: int
    layers: int
    covered: int
    images: tuple[ImageWant, ...]
    state_layers: tuple[int, ...] = ()  # layers whose blocks are state snapshots (hybrid)
    quantized: bool = False  # --kv-bits: each keys / values tensor is a triple (QUANT_PARTS)

    def __bool__(self) -> bool:
        return bool(self.blocks or self.images)

    def covered_after(self, blocks_read: int) -> int:
        """Prompt tokens a hit covers once the first `blocks_read` blocks were read."""
        if blocks_read == 0:
            return self.covered
        return max(self.covered, (self.blocks[0].index + blocks_read) * self.block_tokens)


@dataclass(frozen=True)
class ReadBlock:
    """A checked KV block: per layer (keys, values) as raw tensors (quantized KV: triples of
    them), its byte size, rope delta after it and the content hashes of the images starting
    in it."""

    index: int
    key: str
    layers: tuple[tuple[KVTensors, KVTensors], ...]
    nbytes: int
    rope_delta: int
    images: tuple[str, ...]
    snapshot_nbytes: int = 0  # the recurrent layers' snapshot share of `nbytes`


@dataclass(frozen=True)
class ReadFeatures:
    """An image's checked features (and Qwen3-VL's deepstack layers), raw."""

    key: str
    num_tokens: int
    grid_thw: tuple[int, ...]
    features: RawTensor
    deepstack: tuple[RawTensor, ...]


def check_block(
    want: BlockWant, block: int, layers: int, meta: Mapping[str, str],
    tensors: Mapping[str, RawTensor], state_layers: tuple[int, ...] = (),
    quantized: bool = False,
) -> ReadBlock:  # fmt: skip
    """The block as the request wants it, or ValueError/KeyError/TypeError/RecursionError
    where the file disagrees (the metadata is not covered by the checksum). Its dtype is
    fixed by the namespace: the model, its embeddings' dtype and the KV's bits. A layer of
    `state_layers` holds one row's state snapshot (two arrays of one row each) instead of KV
    rows; `quantized`: each keys / values tensor is a triple (`tensor_names`)."""
    k = want.index
    if int(meta["block_index"]) != k or int(meta["block_tokens"]) != block:
        raise ValueError(f"block {meta['block_index']} of {meta['block_tokens']}, expected {k}")
    if json.loads(meta["token_key"]) != list(want.items):
        raise ValueError("token key differs from the prompt's")
    if int(meta["rope_delta"]) != want.rope_delta:
        raise ValueError(f"rope delta {meta['rope_delta']}, expected {want.rope_delta}")
    quant = quantized and not state_layers  # (hybrid models are never quantized)
    names = [n for kv in "kv" for i in range(layers) for n in tensor_names(kv, i, quant)]
    if set(tensors) != set(names):
        raise ValueError(f"{len(tensors)} tensors for {layers} layers")
    pairs, nbytes, states = [], 0, 0
    for i in range(layers):
        kk, vv = ([tensors[n] for n in tensor_names(kv, i, quant)] for kv in "kv")
        size = sum(t.nbytes for t in (*kk, *vv))
        if i in state_layers:
            if kk[0].shape[:1] != (1,) or vv[0].shape[:1] != (1,):
                raise ValueError(f"layer {i}: snapshot shapes {kk[0].shape} {vv[0].shape}")
            states += size
        elif any(len(t.shape) != 4 or t.shape[2] != block for t in (*kk, *vv)):
            raise ValueError(f"layer {i}: shapes {[t.shape for t in (*kk, *vv)]}")
        pairs.append((tuple(kk), tuple(vv)) if quant else (kk[0], vv[0]))
        nbytes += size
    images = json.loads(meta["images"])
    if not isinstance(images, list) or not all(isinstance(i, str) for i in images):
        raise ValueError(f"images {meta['images'][:100]!r}: not a list of content hashes")
    return ReadBlock(k, want.key, tuple(pairs), nbytes, want.rope_delta, tuple(images), states)


def check_features(
    want: ImageWant, meta: Mapping[str, str], tensors: Mapping[str, RawTensor]
) -> ReadFeatures:
    """The image's features as the request wants them, or ValueError/KeyError/TypeError."""
    expect = {
        "pixel_hash": want.pixel_hash,
        "num_tokens": str(want.num_tokens),
        "grid_thw": json.dumps(list(want.grid_thw)),
    }
    for name, value in expect.items():
        if meta.get(name) != value:
            raise ValueError(f"{name} is {meta.get(name)!r}, expected {value!r}")
    layers = int(meta["deepstack"])
    if set(tensors) != {"features", *(f"deepstack.{i}" for i in range(layers))}:
        raise ValueError(f"unexpected tensors {sorted(tensors)}")
    arrays = (tensors["features"], *(tensors[f"deepstack.{i}"] for i in range(layers)))
    for tensor in arrays:
        if tensor.dtype != want.dtype:
            raise ValueError(f"dtype {tensor.dtype}, expected {want.dtype}")
        if len(tensor.shape) != 2 or tensor.shape[0] != want.num_tokens:
            raise ValueError(f"shape {tensor.shape}, expected {want.num_tokens} rows")
    return ReadFeatures(want.key, want.num_tokens, want.grid_thw, arrays[0], arrays[1:])
