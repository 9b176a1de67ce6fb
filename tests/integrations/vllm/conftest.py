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
    ]
)
