"""Integrations: kvcore plans inside other engines (one sub-package per engine, each an extra).

This layer sits above the engine layer and below the command line. Only its own sub-packages
import the engine they integrate with, and they import it lazily or only where the engine is
required, so ``kvcore`` itself never needs it.
"""
