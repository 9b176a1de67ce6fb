"""Every built-in spec kind passes the same conformance suite a third-party kind does."""

import pytest
from hypothesis import settings

from kvcore import Registry
from kvcore.testing.conformance import SpecKindConformance

#: The kinds the built-in plugins register (read from a registry, so a new built-in is covered).
BUILTIN_KINDS = tuple(Registry.default(autoload=False).kinds)

#: Field overlays each built-in kind must reject, besides the bad block sizes every kind rejects.
_ATTENTION = (
    {"num_kv_heads": 0},
    {"head_size": -1},
    {"num_kv_heads": "8"},
    {"dtype": "int4"},
    {"dtype": "complex64"},
)
INVALID_KWARGS = {
    "full_attention": _ATTENTION,
    "sliding_window": (*_ATTENTION, {"sliding_window": 0}, {"sliding_window": None}),
    "chunked_local_attention": (*_ATTENTION, {"attention_chunk_size": 0}, {"attention_chunk_size": 1.5}),
    "mla": ({"kv_lora_rank": 0}, {"qk_rope_head_dim": -64}, {"kv_lora_rank": "512"}, {"dtype": "nope"}),
    "compressed_mla": (
        {"compress_ratio": 0},
        {"head_dim": 0},
        {"entry_bytes": -1},
        {"page_alignment": 0},
        {"dtype": "nope"},
    ),
    "compressed_indexer": (
        {"compress_ratio": 0},
        {"index_head_dim": 0},
        {"index_head_dim": 100, "scale_block_size": 64},
        {"page_alignment": 0},
    ),
    "sliding_window_mla": (
        {"sliding_window": 0},
        {"head_dim": 0},
        {"entry_bytes": -1},
        {"page_alignment": 0},
        {"dtype": "int4"},
    ),
}


class TestBuiltinKinds(SpecKindConformance):
    # every check runs once per built-in kind; 25 examples each keep the file to a few seconds
    hypothesis_settings = settings(max_examples=25)

    @pytest.fixture(params=BUILTIN_KINDS)
    def spec_cls(self, request, kvcore_registry):
        return kvcore_registry.spec_class(request.param)

    @pytest.fixture
    def invalid_kwargs(self, spec_cls):
        return INVALID_KWARGS.get(spec_cls.kind, ())


def test_every_builtin_kind_is_covered():
    assert set(BUILTIN_KINDS) >= {
        "full_attention",
        "sliding_window",
        "chunked_local_attention",
        "mla",
        "compressed_mla",
        "compressed_indexer",
        "sliding_window_mla",
    }
