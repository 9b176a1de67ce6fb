"""A loaded transformers model's specs, the ``ContinuousBatchingConfig`` of a plan, and a check
that the paged cache transformers built is the one planned.

transformers' continuous batching builds its ``PagedAttentionCache`` itself; the seam it
documents for its size and layout is ``ContinuousBatchingConfig`` (``page_size``,
``num_blocks``, ``max_batch_tokens``), which :func:`continuous_batching_config` fills from a
:class:`~kvcore.integrations.transformers.rules.TransformersPlan`. transformers is imported
only inside these functions.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from kvcore.frontends.hf_config import layer_specs_from_config
from kvcore.integrations.transformers.rules import (
    TRANSFORMERS_VERSIONS,
    TransformersIntegrationError,
    TransformersPlan,
    TransformersRules,
    plan_for_transformers,
)
from kvcore.planning.registry import Registry
from kvcore.policy import AllocationPolicy, PlanOptions
from kvcore.spec import KVCacheSpec

if TYPE_CHECKING:
    import torch
    from transformers import ContinuousBatchingConfig
    from transformers.generation.continuous_batching.cache import PagedAttentionCache


def _transformers_version() -> str:
    try:
        import transformers
    except ImportError:
        raise TransformersIntegrationError(
            "transformers is not installed; install kvcore[transformers] (transformers "
            f"{TRANSFORMERS_VERSIONS})"
        ) from None
    return str(transformers.__version__)


def model_specs(model: torch.nn.Module, registry: Registry) -> dict[str, KVCacheSpec]:
    """``{layer name: spec}`` of a loaded model, read from its config by kvcore's model families,
    in the model's dtype (transformers' paged cache is kept in it).

    Raises:
        UnknownModelError, ModelConfigError: as :func:`~kvcore.frontends.hf_config.layer_specs_from_config`.
    """
    config: Any = model.config
    dtype = str(getattr(model, "dtype", "float32")).removeprefix("torch.")
    return layer_specs_from_config(config.to_dict(), registry, {"kv_cache_dtype": dtype})


def plan_for_model(
    model: torch.nn.Module,
    available_bytes: int,
    rules: TransformersRules,
    *,
    registry: Registry,
    policy: str | AllocationPolicy = "auto",
    options: PlanOptions | None = None,
) -> TransformersPlan:
    """:func:`model_specs` then :func:`~kvcore.integrations.transformers.rules.plan_for_transformers`.

    Raises:
        TransformersIntegrationError, PolicyNotApplicableError, InsufficientMemoryError: as
            :func:`~kvcore.integrations.transformers.rules.plan_for_transformers`.
    """
    specs = model_specs(model, registry)
    request = rules.request(specs, available_bytes, policy=policy, options=options)
    return plan_for_transformers(request, rules, registry=registry)


def continuous_batching_config(plan: TransformersPlan, **fields: Any) -> ContinuousBatchingConfig:
    """The ``transformers.ContinuousBatchingConfig`` that lays out the paged cache as ``plan``
    says (page size, ``num_blocks``, ``max_batch_tokens``), with any other ``fields``.

    Raises:
        TransformersIntegrationError: transformers is missing, or ``fields`` set one of the
            plan's own fields to something else.
    """
    _transformers_version()
    from transformers import ContinuousBatchingConfig

    planned = plan.config_fields()
    clashes = sorted(key for key, value in fields.items() if key in planned and value != planned[key])
    if clashes:
        raise TransformersIntegrationError(
            f"{clashes} are the plan's to set ({ {k: planned[k] for k in clashes} }); plan again with other "
            "rules or budget instead"
        )
    return ContinuousBatchingConfig(**{**fields, **planned})


def check_cache(cache: PagedAttentionCache, plan: TransformersPlan) -> None:
    """Raise unless the ``PagedAttentionCache`` transformers built is the one ``plan`` laid out:
    the same allocators over the same layers, page size, sector size and sector count.

    Raises:
        TransformersIntegrationError: naming each figure that differs.
    """
    layout = plan.layout
    built = {
        name: (tuple(allocator.layer_indices), allocator.tokens_per_page, allocator.bytes_per_block)
        for name, allocator in cache.cache_allocators.items()
    }
    planned = {a.attention: (a.layer_indices, a.page_size, a.bytes_per_block) for a in layout.allocators}
    problems = []
    if built != planned:
        problems.append(f"allocators (layers, page size, block bytes) {built}, planned {planned}")
    if cache.bytes_per_sector != layout.bytes_per_sector:
        problems.append(f"sectors of {cache.bytes_per_sector} bytes, planned {layout.bytes_per_sector}")
    if cache.num_sectors != layout.num_sectors:
        problems.append(f"{cache.num_sectors} sectors, planned {layout.num_sectors}")
    if problems:
        raise TransformersIntegrationError(
            f"transformers {_transformers_version()} built its paged cache differently from kvcore's plan: "
            + "; ".join(problems)
        )
