"""kvcore inside SGLang 0.5 (``kvcore[sglang]``): plans sized by kvcore run as SGLang's memory pools.

:mod:`.rules` holds SGLang's sizing rules and plans under them without SGLang or torch (the
CLI's ``kvcore compare --engine sglang`` uses it); :mod:`.convert` builds SGLang's own
``MemoryPoolConfig`` and pools from a plan, and :mod:`.plugin` is the ``sglang.srt.plugins``
entry point that swaps SGLang's memory-pool configurator for kvcore's when
``KVCORE_SGLANG_POLICY`` is set. Only those two import SGLang.
"""
