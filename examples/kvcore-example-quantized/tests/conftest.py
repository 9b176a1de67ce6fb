"""Test set-up of the example plugin: its hypothesis profile.

The plugin's strategy needs no set-up: ``quantized.py`` registers it through the
``kvcore_register_spec_strategies`` hook, so kvcore's strategies and conformance suites draw
``example.quantized_kv`` specs whenever the plugin is in the registry.
"""

import os

from hypothesis import settings

settings.register_profile("ci", max_examples=40, deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))
