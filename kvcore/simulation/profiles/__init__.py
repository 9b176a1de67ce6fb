"""The built-in scheduler profiles, registered through ``kvcore_register_scheduler_profiles``
exactly as a third-party engine's would be (this module is one of
``kvcore.planning.manager.BUILTIN_PLUGINS``).

- ``vllm`` (the default): vLLM 0.33's v1 scheduler and KV-cache manager
  (:mod:`kvcore.simulation.profiles.vllm`);
- ``vllm-reference``: the same scheduler written plainly, vLLM's methods one by one with no
  speed path (:mod:`kvcore.simulation.profiles.vllm_reference`): the figures of ``vllm``, slower;
- ``kvcore``: the simulator's own rules (:mod:`kvcore.simulation.profiles.kvcore_rules`);
- ``sglang``: SGLang 0.5.23's scheduler, radix cache and token pools
  (:mod:`kvcore.simulation.profiles.sglang`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from kvcore.hookspecs import hookimpl


@hookimpl
def kvcore_register_scheduler_profiles(register: Callable[[Any], None]) -> None:
    from kvcore.simulation.profiles.kvcore_rules import KvcoreProfile
    from kvcore.simulation.profiles.sglang import SglangProfile
    from kvcore.simulation.profiles.vllm import VllmProfile

    register(VllmProfile())
    register(KvcoreProfile())
    register(SglangProfile())
    register(
        VllmProfile(
            name="vllm-reference",
            description="vLLM 0.33's v1 scheduler written plainly: the vllm profile's figures, slower",
            reference=True,
        )
    )
