"""kvcore-example-quantized: an example kvcore plugin package.

- :mod:`kvcore_example_quantized.quantized`: spec kind ``example.quantized_kv`` (int8/fp8 K and
  V with per-block scales) and its page layout;
- :mod:`kvcore_example_quantized.separate_regions`: policy ``example.separate_regions``, a
  baseline that never lets groups share bytes;
- :mod:`kvcore_example_quantized.strategies`: a hypothesis strategy for the kind (tests only).

kvcore finds the two plugin modules through the entry points in ``pyproject.toml``; nothing
here registers anything at import time.
"""

from kvcore_example_quantized.quantized import QuantizedKVSpec
from kvcore_example_quantized.separate_regions import SeparateRegionsPolicy

__all__ = ["QuantizedKVSpec", "SeparateRegionsPolicy"]
