"""Offline builder of random-weight checkpoints that mlx-vlm / mlx-lm load as real ones.

    build_model(out_dir, arch, size, seed, progress) -> out_dir
    ensure_model(arch, size, seed, progress) -> default_model_dir(arch, size, seed), built once
    built_model(arch, size, seed) -> that folder if already built, else None (builds nothing)

Either takes `quantize=4|8` (and `group_size`): the float checkpoint is built first, then
quantized by the runtime's own converter (see quantize.py).

`arch` is a family (`families.ARCHS`): the Qwen-VL ones (qwen2_vl, qwen2_5_vl, qwen3_vl),
the vision-language families loaded by mlx-vlm, and the text models loaded by mlx-lm (qwen3,
llama). A checkpoint is: a BPE tokenizer trained here with the family's pipeline, special
tokens and real chat template (padded with never-encoded filler words up to the embedding
size, so every id the model samples decodes to text), config.json / generation_config.json
and the family's processor files, checked by the runtime's own config classes and by
transformers', and normal(0, 0.02) weights (norm scales 1, shifts 0) in safetensors under the
exact names the runtime's Model uses. Everything is a pure function of (arch, size, seed,
dtype, quantization, BUILDER_VERSION): the same arguments give byte-identical files. Nothing
touches the network. The answers of such a model are noise; only its shapes, tokenizer and
processing are real.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Callable
from importlib import metadata
from pathlib import Path

from .checkpoint import write_weights
from .families import ARCHS, FAMILIES, check_arch_size, family
from .params import validate_config
from .quantize import DEFAULT_GROUP_SIZE, check_quantize, quantize_checkpoint
from .shapes import SIZES

__all__ = [
    "ARCHS",
    "FAMILIES",
    "SIZES",
    "BUILDER_VERSION",
    "build_model",
    "built_model",
    "default_model_dir",
    "ensure_model",
    "family",
]

# Bump by hand for changes the digest below cannot see, and as a record when the files of an
# existing build change. 2: specials and filler tokens in the BPE vocab, tokenizer padded to
# the embedding size (tiny: same ids and encodings, different tokenizer.json/vocab.json).
_RECIPE = "2"
MARKER = "vision_gateway_build.json"  # written last: its presence means the build completed


def _builder_version() -> str:
    # The recipe version plus a digest of this package's sources (chat templates included) and
    # of the library versions that shape the bytes (BPE training, numpy's normal sampler, the
    # runtimes' parameter names, their quantizers and mlx-lm's tokenizer re-save): editing the
    # recipe or upgrading one of them yields a new cache dir, never a stale one.
    h = hashlib.sha256()
    root = Path(__file__).parent
    for src in sorted(root.rglob("*.py")):
        h.update(src.relative_to(root).as_posix().encode() + b"\0" + src.read_bytes())
    for dist in ("tokenizers", "numpy", "mlx-vlm", "mlx-lm", "transformers"):
        try:
            h.update(f"{dist}={metadata.version(dist)}".encode())
        except metadata.PackageNotFoundError:
            h.update(f"{dist}=none".encode())
    return f"{_RECIPE}.{h.hexdigest()[:10]}"


BUILDER_VERSION: str = _builder_version()


def _check_seed(seed: int) -> None:
    if not isinstance(seed, int) or isinstance(seed, bool) or seed < 0:
        raise ValueError(f"seed must be a non-negative int, got {seed!r}")


def _dump(path: Path, obj: object) -> None:
    path.write_text(json.dumps(obj, indent=2) + "\n", encoding="utf-8")


def _quant_info(bits: int | None, group_size: int) -> dict[str, int] | None:
    return None if bits is None else {"bits": bits, "group_size": group_size}


def _write_checkpoint(
    out: Path,
    arch: str,
    size: str,
    seed: int,
    dtype: str,
    say: Callable[[str], None],
    quant: dict[str, int] | None = None,
) -> None:
    fam = family(arch)
    if quant is not None:
        with tempfile.TemporaryDirectory(prefix=f".{out.name}.float-", dir=out.parent) as src:
            _write_checkpoint(Path(src), arch, size, seed, dtype, say)
            say(f"quantizing to {quant['bits']} bits with {fam.runtime}")
            quantize_checkpoint(
                Path(src), out, quant["bits"], quant["group_size"], runtime=fam.runtime
            )
        _write_marker(out, arch, size, seed, dtype, quant)
        return
    say("training tokenizer")
    config = fam.write_files(out, size, dtype)  # tokenizer, config.json, processor files
    say(f"validating config with {fam.runtime}")
    specs = validate_config(config, fam.runtime)
    write_weights(out, specs, seed, dtype, say)
    _write_marker(out, arch, size, seed, dtype, None)
    say("done")


def _write_marker(
    out: Path, arch: str, size: str, seed: int, dtype: str, quant: dict[str, int] | None
) -> None:
    (out / MARKER).unlink(missing_ok=True)  # a quantized build copies its source's marker
    files = {p.name: p.stat().st_size for p in sorted(out.iterdir())}
    info = {
        "builder_version": BUILDER_VERSION,
        "arch": arch,
        "size": size,
        "seed": seed,
        "dtype": dtype,
        "quantization": quant,
        "files": files,
    }
    _dump(out / MARKER, info)


def _is_complete(
    path: Path, arch: str, size: str, seed: int, dtype: str, quant: dict[str, int] | None
) -> bool:
    """True if `path` holds a finished build of exactly these arguments, files intact."""
    try:
        info = json.loads((path / MARKER).read_text(encoding="utf-8"))
        want = {
            "builder_version": BUILDER_VERSION,
            "arch": arch,
            "size": size,
            "seed": seed,
            "dtype": dtype,
            "quantization": quant,
        }
        if any(info.get(k) != v for k, v in want.items()):
            return False
        return all((path / n).stat().st_size == s for n, s in info["files"].items())
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return False


def _build_tmp(
    out_dir: Path,
    arch: str,
    size: str,
    seed: int,
    dtype: str,
    progress: Callable[[str], None] | None,
    quant: dict[str, int] | None,
) -> Path:
    """Build into a fresh temp dir next to `out_dir` (same file system: rename is atomic)."""
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.tmp-", dir=out_dir.parent))
    try:
        # (mkdtemp makes it 0700 and it stays so: the server builds its embedded model with
        # umask 077, like everything else it writes; docs/security.md)
        _write_checkpoint(tmp, arch, size, seed, dtype, progress or (lambda _msg: None), quant)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return tmp


def _move_aside(path: Path) -> Path | None:
    """Rename `path` out of the way (for deletion); None if it vanished meanwhile."""
    trash = Path(tempfile.mkdtemp(prefix=f".{path.name}.old-", dir=path.parent))
    try:
        os.rename(path, trash / "x")
    except FileNotFoundError:
        shutil.rmtree(trash, ignore_errors=True)
        return None
    return trash


def build_model(
    out_dir: Path,
    arch: str = "qwen2_vl",
    size: str = "tiny",
    seed: int = 0,
    progress: Callable[[str], None] | None = None,
    *,
    dtype: str | None = None,
    quantize: int | None = None,
    group_size: int = DEFAULT_GROUP_SIZE,
) -> Path:
    """Write a complete checkpoint dir for (arch, size, seed) at `out_dir`; return `out_dir`.

    `dtype` defaults to float32 for tiny and bfloat16 for 7b. `quantize` (4 or 8) quantizes
    the language model with mlx-vlm's converter (`group_size` weights per scale). The build
    happens in a temp dir next to `out_dir` that is renamed into place at the end, so
    `out_dir` never holds a partial checkpoint; an existing `out_dir` is replaced.
    `progress` receives short status lines ("training tokenizer", "writing weights 1/4 ...").
    Raises ValueError for an unknown arch, size, dtype or bit width or a negative seed.
    """
    dtype = check_arch_size(arch, size, dtype)
    _check_seed(seed)
    check_quantize(quantize, group_size)
    out_dir = Path(out_dir).expanduser().absolute()
    tmp = _build_tmp(out_dir, arch, size, seed, dtype, progress, _quant_info(quantize, group_size))
    trash = _move_aside(out_dir) if out_dir.exists() else None
    try:
        os.rename(tmp, out_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        if trash is not None:  # put the previous checkpoint back rather than lose it
            os.rename(trash / "x", out_dir)
            trash.rmdir()
        raise
    if trash is not None:
        shutil.rmtree(trash, ignore_errors=True)
    return out_dir


def cache_root() -> Path:
    """$VISION_GATEWAY_CACHE, else $XDG_CACHE_HOME/vision-gateway, else ~/.cache/vision-gateway."""
    if os.environ.get("VISION_GATEWAY_CACHE"):
        return Path(os.environ["VISION_GATEWAY_CACHE"]).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "vision-gateway"


def default_model_dir(
    arch: str = "qwen2_vl",
    size: str = "tiny",
    seed: int = 0,
    *,
    dtype: str | None = None,
    quantize: int | None = None,
    group_size: int = DEFAULT_GROUP_SIZE,
) -> Path:
    """Where `ensure_model` keeps this checkpoint: `<cache_root>/models/<name>`, the name
    spelling out arch, size, dtype, quantization, seed and BUILDER_VERSION (nothing is
    created here)."""
    dtype = check_arch_size(arch, size, dtype)
    _check_seed(seed)
    check_quantize(quantize, group_size)
    quant = "" if quantize is None else f"-q{quantize}g{group_size}"
    return cache_root() / "models" / f"{arch}-{size}-{dtype}{quant}-seed{seed}-b{BUILDER_VERSION}"


def built_model(
    arch: str = "qwen2_vl",
    size: str = "tiny",
    seed: int = 0,
    *,
    dtype: str | None = None,
    quantize: int | None = None,
    group_size: int = DEFAULT_GROUP_SIZE,
) -> Path | None:
    """`default_model_dir(...)` when a complete build of these arguments is there, else None.
    Builds nothing and imports no MLX (the server's HTTP process asks it first:
    `child.ensure_model_in_child`)."""
    dtype = check_arch_size(arch, size, dtype)
    target = default_model_dir(
        arch, size, seed, dtype=dtype, quantize=quantize, group_size=group_size
    )
    quant = _quant_info(quantize, group_size)
    return target if _is_complete(target, arch, size, seed, dtype, quant) else None


def ensure_model(
    arch: str = "qwen2_vl",
    size: str = "tiny",
    seed: int = 0,
    progress: Callable[[str], None] | None = None,
    *,
    dtype: str | None = None,
    quantize: int | None = None,
    group_size: int = DEFAULT_GROUP_SIZE,
) -> Path:
    """Return `default_model_dir(...)`, building it first if it is missing or incomplete.

    Safe when processes race: each builds in its own temp dir and renames it into place;
    a loser finds the winner's complete dir, discards its own and uses the winner's. (Both
    spend the build time; that is seconds for tiny.)
    """
    dtype = check_arch_size(arch, size, dtype)
    built = built_model(arch, size, seed, dtype=dtype, quantize=quantize, group_size=group_size)
    if built is not None:
        return built
    target = default_model_dir(
        arch, size, seed, dtype=dtype, quantize=quantize, group_size=group_size
    )
    quant = _quant_info(quantize, group_size)
    tmp = _build_tmp(target, arch, size, seed, dtype, progress, quant)
    try:
        for _ in range(3):
            try:
                os.rename(tmp, target)  # atomic; fails if target exists and is not empty
                return target
            except OSError:
                if _is_complete(target, arch, size, seed, dtype, quant):
                    return target  # another process won the race
                trash = _move_aside(target)  # a stale or broken dir: replace it
                if trash is not None:
                    shutil.rmtree(trash, ignore_errors=True)
        raise RuntimeError(f"could not install the model at {target}")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
