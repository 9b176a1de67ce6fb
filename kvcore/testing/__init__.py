"""Testing support for kvcore and for plugin authors: hypothesis strategies and plan checks.

- :mod:`kvcore.testing.strategies`: composable hypothesis strategies for specs, layer maps,
  sizing contexts and budgets.
"""
