"""kvcore 0.1's name of :mod:`kvcore.plugins.models.kit`, the model-family kit, removed in 0.3.

Importing it fails with the error that says where the kit is now (and, for a 0.1 family, what
replaced ``claim``), rather than a bare "No module named".
"""

from kvcore.removed import removed_message

raise ModuleNotFoundError(
    removed_message(
        "kvcore.plugins.models.common",
        "kvcore.plugins.models.kit (0.1's claim: register kvcore.ModelFamily(name=..., "
        "model_types=(...), layer_specs=...) from kvcore_register_model_families, "
        "docs/how-to/add-a-model-family.md)",
    ),
    name="kvcore.plugins.models.common",
)
