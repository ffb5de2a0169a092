"""The MLX-free family facts (gateway/processors/families.py) are the engine's own.

Pinned: the registry dispatches every vision-language `model_type` to the class whose name,
model types and `kv_quant_off` are the facts' row (one table: a class that changes its types
or its reason without the row, or the reverse, fails here); the copy of mlx-lm's renames is
mlx-lm's; whether mlx-lm has a module for a type, read from its files, is what importing
mlx-lm says, for every module it ships, every renamed type and names it has not.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from gateway.engine.families.registry import FAMILIES, class_of
from gateway.processors.families import (
    MLX_LM_REMAPPING,
    TEXT,
    VISION_FAMILIES,
    kv_quant_refusal,
    mlx_lm_has,
)


@pytest.mark.parametrize("facts", VISION_FAMILIES, ids=lambda f: f.family)
def test_each_family_class_states_the_facts_of_its_row(facts) -> None:  # noqa: ANN001
    """Invariant: the class serving a row is named as the row, serves exactly its model types
    (its module's `MODEL_TYPES`, and the class's where it has its own) and gives the same
    reason to refuse quantized KV, and takes the same media."""
    family = class_of(facts)
    assert family.family == facts.family
    own = sys.modules[family.__module__].MODEL_TYPES
    assert tuple(getattr(family, "MODEL_TYPES", own)) == tuple(own) == facts.model_types
    assert family.kv_quant_off == facts.kv_quant_off
    assert family.media == facts.media
    assert all(FAMILIES[t] is family for t in facts.model_types)


def test_the_registry_serves_exactly_the_rows_model_types() -> None:
    """Invariant: FAMILIES holds the rows' model types and no other; text models are the
    text family's class, which refuses no --kv-bits up front."""
    assert set(FAMILIES) == {t for f in VISION_FAMILIES for t in f.model_types}
    assert class_of(TEXT).family == "text" and class_of(TEXT).kv_quant_off is None
    assert class_of(TEXT).media == TEXT.media


def test_the_renames_are_mlx_lms_own() -> None:
    """Invariant: the copy equals mlx_lm.utils.MODEL_REMAPPING of the pinned mlx-lm."""
    from mlx_lm.utils import MODEL_REMAPPING

    assert MODEL_REMAPPING == MLX_LM_REMAPPING


def _imported_answer(model_type: str) -> bool:
    """What the registry asked before: find_spec of the module, which imports mlx-lm."""
    from mlx_lm.utils import MODEL_REMAPPING

    name = MODEL_REMAPPING.get(model_type, model_type)
    return importlib.util.find_spec(f"mlx_lm.models.{name}") is not None


def test_mlx_lm_has_agrees_with_importing_mlx_lm() -> None:
    """Invariant: for every model module mlx-lm ships, every renamed type and types it has no
    module for, the file lookup answers as the import machinery does."""
    import mlx_lm.models

    shipped = [p.stem for p in Path(mlx_lm.models.__file__).parent.glob("*.py")]
    names = [*shipped, *MLX_LM_REMAPPING, "no_such_model", "qwen2_vl_x", "bert"]
    assert len(shipped) > 50  # (the lookup read the real folder)
    for name in names:
        assert mlx_lm_has(name) == _imported_answer(name), name
    assert mlx_lm_has("llama") and mlx_lm_has("mistral") and mlx_lm_has("qwen3")
    assert not mlx_lm_has("") and not mlx_lm_has("../utils") and not mlx_lm_has("models.llama")


def test_the_refusal_names_the_flag_the_type_and_the_reason() -> None:
    """Invariant: no sentence without bits or without a reason; else one naming all three."""
    assert kv_quant_refusal("gemma3", "keeps windows", 0) is None
    assert kv_quant_refusal("qwen3", None, 8) is None
    assert kv_quant_refusal("gemma3", "keeps windows", 4) == (
        "--kv-bits 4: gemma3 keeps windows, which quantized KV does not cover yet; "
        "serve this model without --kv-bits"
    )
