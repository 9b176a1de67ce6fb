"""Test set-up of the example plugin: its hypothesis strategy and profile."""

import os

from hypothesis import settings
from kvcore.testing.strategies import register_spec_strategy

from kvcore_example_quantized import QuantizedKVSpec
from kvcore_example_quantized.strategies import quantized_specs

# kvcore's strategies (and the conformance suites) draw example.quantized_kv specs from this.
register_spec_strategy(QuantizedKVSpec, quantized_specs())

settings.register_profile("ci", max_examples=40, deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))
