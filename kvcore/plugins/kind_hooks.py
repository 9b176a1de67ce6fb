"""The two registration hooks a spec-kind module implements, written once for every kind.

A kind module registers its spec class (``kvcore_register_spec_kinds``) and a hypothesis
strategy for it (``kvcore_register_spec_strategies``); both bodies are the same for every kind
but for the class and the strategy function, so :func:`kind_hooks` writes them::

    kvcore_register_spec_kinds, kvcore_register_spec_strategies = kind_hooks(
        FullAttentionSpec, full_attention_specs
    )

pluggy finds hook implementations by their module attribute's name, so the two functions must
be bound to exactly those names.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol, TypeVar

from kvcore.hookspecs import hookimpl
from kvcore.spec import KVCacheSpec

if TYPE_CHECKING:
    from hypothesis.strategies import SearchStrategy

    from kvcore.dtypes import DType

_S = TypeVar("_S", bound=KVCacheSpec, covariant=True)


class SpecStrategy(Protocol[_S]):
    """A kind's strategy function: keyword ``block_sizes`` and ``dtypes``, the rest defaulted
    (tests only: it imports hypothesis when called).

    Args:
        block_sizes: where ``block_size`` comes from (the testing kit's ``block_sizes()``).
        dtypes: where dtypes come from (the testing kit's ``dtypes()``).

    Returns:
        A strategy drawing valid instances of the kind.
    """

    def __call__(
        self, *, block_sizes: SearchStrategy[int], dtypes: SearchStrategy[DType]
    ) -> SearchStrategy[_S]: ...


RegisterKinds = Callable[[Callable[[type[KVCacheSpec]], None]], None]
RegisterStrategies = Callable[
    [
        Callable[[type[KVCacheSpec], "SearchStrategy[KVCacheSpec]"], None],
        "SearchStrategy[int]",
        "SearchStrategy[DType]",
    ],
    None,
]


def kind_hooks(
    spec_type: type[KVCacheSpec], strategy: SpecStrategy[KVCacheSpec]
) -> tuple[RegisterKinds, RegisterStrategies]:
    """The ``kvcore_register_spec_kinds`` and ``kvcore_register_spec_strategies`` implementations
    that register ``spec_type`` and ``strategy(block_sizes=..., dtypes=...)`` for it.

    Returns:
        The two hook implementations, in that order, to bind to those names at module level.
    """

    @hookimpl
    def kvcore_register_spec_kinds(register: Callable[[type[KVCacheSpec]], None]) -> None:
        register(spec_type)

    @hookimpl
    def kvcore_register_spec_strategies(
        register: Callable[[type[KVCacheSpec], SearchStrategy[KVCacheSpec]], None],
        block_sizes: SearchStrategy[int],
        dtypes: SearchStrategy[DType],
    ) -> None:
        register(spec_type, strategy(block_sizes=block_sizes, dtypes=dtypes))

    return kvcore_register_spec_kinds, kvcore_register_spec_strategies
