"""The error of kvcore's vLLM integration, in a module of its own so that the release table
(:mod:`~kvcore.integrations.vllm.versions`) and the rules (:mod:`~kvcore.integrations.vllm.rules`)
both raise it without importing each other."""

from __future__ import annotations

from kvcore.errors import KVCoreError


class VllmIntegrationError(KVCoreError, ValueError):
    """Something kvcore and vLLM cannot agree on: a vLLM spec kind kvcore does not know, a plan
    vLLM cannot run, or vLLM missing or of a version the integration does not support."""
