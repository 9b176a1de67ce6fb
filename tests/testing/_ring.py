"""A sound third-party spec kind that the tests of the plugin-author kit subclass and register."""

from __future__ import annotations

import attrs

from kvcore import KVCacheSpec
from kvcore.spec import cdiv, positive_int


@attrs.frozen(kw_only=True)
class Ring(KVCacheSpec):
    """A sound kind: a ring of ``slots`` bytes per token, holding the last 64 tokens in the pages
    of its first 64 (which it reuses). Its worst case is the default, read off ``live_pages``."""

    kind = "test.ring"
    slots: int = attrs.field(default=4, validator=positive_int)

    @property
    def page_size_bytes(self):
        return self.block_size * self.slots

    def live_pages(self, num_tokens, num_computed_tokens=0):
        return range(min(cdiv(num_tokens, self.block_size), cdiv(64, self.block_size)))
