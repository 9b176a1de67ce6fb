"""A reference paged-attention runner: real transformers models decoding on kvcore's caches.

It is the proof that a plan works in use: requests of different lengths decode at once, their
pages (of every group) interleave in the plan's memory, sliding-window pages go back to the
pool as decoding moves on, and the tokens must still be the ones transformers generates.
Plain torch ops, written for clarity rather than speed (the tests run it on the CPU).

- :mod:`.pages`: a request's K and V in one layer's allocated view, through a block table;
- :mod:`.attention`: causal attention over those pages (window, chunk, scaling, softcap, sinks),
  transformers' eager math;
- :mod:`.transformers_attention`: the function registered with transformers'
  ``AttentionInterface``;
- :mod:`.requests`: :class:`DecodeRequest` and :class:`ScheduledRequest`, what is asked;
- :mod:`.runner`: :class:`PagedAttentionRunner`, one engine step at a time on a
  :class:`kvcore.BlockPool`;
- :mod:`.decoding`: :func:`decode_greedy`, a continuous-batching scheduler over the runner.

Needs ``kvcore[transformers]`` to run a model (transformers is imported when a runner is made).
"""

from kvcore.testing.reference.decoding import Generation, decode_greedy
from kvcore.testing.reference.requests import DecodeRequest, ScheduledRequest
from kvcore.testing.reference.runner import BoundLayer, PagedAttentionRunner, PageEvent
from kvcore.testing.reference.transformers_attention import ATTENTION_NAME, register_attention

__all__ = [
    "ATTENTION_NAME",
    "BoundLayer",
    "DecodeRequest",
    "Generation",
    "PageEvent",
    "PagedAttentionRunner",
    "ScheduledRequest",
    "decode_greedy",
    "register_attention",
]
