"""kvcore's plans in transformers' continuous batching (``generate_batch``), extra ``kvcore[transformers]``.

:mod:`.rules` holds transformers' paged-cache rules and plans for them without torch or
transformers; :mod:`.convert` reads a loaded model's specs and builds the
``ContinuousBatchingConfig`` that lays out its cache as planned, and checks the cache it made.
"""
