"""Testing support for kvcore and for plugin authors.

- :mod:`kvcore.testing.strategies`: composable hypothesis strategies for specs of any registered
  kind, layer maps, sizing contexts, budgets, planning problems and plans.
- :mod:`kvcore.testing.conformance`: ``SpecKindConformance`` and ``PolicyConformance``, the suites
  a plugin's tests subclass.
- :mod:`kvcore.testing.checks`: the checks those suites run, as plain functions.
- :mod:`kvcore.testing.registries`: fresh registries of the built-ins plus the plugins under test.
- :mod:`kvcore.testing.pytest_plugin`: the pytest plugin (entry point ``pytest11``) with the
  ``kvcore_registry`` fixtures.
- :mod:`kvcore.testing.mixes`: named layer mixes the built-in policies are tested and measured on.
- :mod:`kvcore.testing.reference`: a paged-attention runner decoding transformers models on kvcore caches.

Nothing is imported here, so that loading the pytest plugin does not import hypothesis.
"""
