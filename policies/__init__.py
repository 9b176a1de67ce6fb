"""kvcore's built-in allocation policies, each an ordinary plugin module.

- :mod:`kvcore.policies.uniform`: every layer has the same spec; one tensor per layer.
- :mod:`kvcore.policies.shared_buffer`: layers of different kinds; one buffer whose bytes the
  groups share.
"""
