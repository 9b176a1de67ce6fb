"""kvcore's built-in allocation policies, each an ordinary plugin module.

- :mod:`kvcore.policies.uniform`: every layer has the same spec; one tensor per layer.
- :mod:`kvcore.policies.shared_buffer`: layers of different kinds; one buffer whose bytes the
  groups share.
- :mod:`kvcore.policies.equal_groups`: one page size; equal-size groups, a contiguous tensor per
  layer slot (vLLM's hybrid layout).
- :mod:`kvcore.policies.kind_pools`: one block pool and one mixed-page group per retention kind.
"""
