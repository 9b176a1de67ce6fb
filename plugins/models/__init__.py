"""Built-in model families: each module implements ``kvcore_layer_specs`` for a few model types.

:mod:`kvcore.plugins.models.common` holds what they share (typed config reads whose errors name
the field, attention geometry, layer types, SSM state shapes); :mod:`.generic` is the fallback
that honours ``layer_types`` for model types no family claims. Writing a new family is shown in
``docs/how-to/add-a-model-family.md``.
"""
