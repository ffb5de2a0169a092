"""Model families behind one interface (`ModelFamily`); `load_model` picks one by the
checkpoint's `model_type` (see family.py for the contract, registry.py for adding one)."""

from gateway.engine.families.family import CachePolicy, ModelFamily
from gateway.engine.families.registry import UnsupportedModel, load_model, supported_families

__all__ = ["CachePolicy", "ModelFamily", "UnsupportedModel", "load_model", "supported_families"]
