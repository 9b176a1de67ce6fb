"""The messages of errors that suggest a setting to change, worded for whoever reads them.

:class:`~kvcore.errors.InsufficientMemoryError` and :class:`~kvcore.errors.KVCacheAllocationError`
carry every figure of their message; :func:`render` words it, naming the settings to change as a
:class:`ParameterNames` spells them. kvcore raises them worded for a Python caller
(:data:`PYTHON_NAMES`: ``lower max_model_len to 8192``, ``num_blocks=16 holds ...``); the command
line renders the same error with its flags (``lower --max-model-len to 8192``).

This module sits beside :mod:`kvcore.errors` rather than in it because it formats byte counts
(:mod:`kvcore.units`, which itself raises :class:`~kvcore.errors.InvalidInputError`).
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable
from typing import TypeVar

import attrs

from kvcore.errors import (
    GroupLimitError,
    InsufficientMemoryError,
    KVCacheAllocationError,
    KVCoreError,
    MultiplePoolsError,
)
from kvcore.units import format_bytes

_Error = TypeVar("_Error", bound=KVCoreError)


@attrs.frozen(kw_only=True)
class ParameterNames:
    """How a message names the settings a caller can change.

    Attributes:
        max_model_len: the longest request, in tokens.
        num_blocks: a forced block count.
        memory: the KV-cache byte budget.
        utilization: the share of device memory the budget is taken from.
        assign: a setting given a value, with ``{name}`` and ``{value}`` slots.
        max_groups: the bound on the number of groups (block tables).
    """

    max_model_len: str = "max_model_len"
    num_blocks: str = "num_blocks"
    memory: str = "available_bytes/kv_cache_bytes"
    utilization: str = "utilization"
    assign: str = "{name}={value}"
    max_groups: str = "max_groups"

    def setting(self, name: str, value: object) -> str:
        """``name`` given ``value``: ``num_blocks=16`` (Python) or ``--num-blocks 16`` (flags)."""
        return self.assign.format(name=name, value=value)

    def more_memory(self) -> str:
        """The fix for too little memory, naming the budget and the utilization."""
        return f"give the KV cache more memory ({self.memory}, or a higher {self.utilization})"


#: The names a Python caller passes: ``plan_kv_cache(available_bytes=...)``,
#: ``LocalExecutor(kv_cache_bytes=..., utilization=...)``, ``SizingContext(max_model_len=...)``,
#: ``num_blocks=`` of both entry points.
PYTHON_NAMES = ParameterNames()


def plural(count: int, noun: str, *, spec: str = "") -> str:
    """``count`` and ``noun``, in the plural unless the count is one: ``1 group``, ``3 groups``.

    Args:
        count: how many.
        noun: the singular noun (its plural adds an ``s``).
        spec: a format spec for the count, e.g. ``","`` for ``10,922 blocks``.

    Returns:
        The words.
    """
    return f"{count:{spec}} {noun if count == 1 else noun + 's'}"


def render(error: KVCoreError, names: ParameterNames = PYTHON_NAMES) -> str:
    """The message of ``error``, naming the settings to change as ``names`` spells them.

    Args:
        error: any kvcore error.
        names: how to name the settings; :data:`PYTHON_NAMES` by default.

    Returns:
        The message rendered from the error's figures where it carries them (an
        :class:`~kvcore.errors.InsufficientMemoryError` with a ``reason``, a
        :class:`~kvcore.errors.KVCacheAllocationError` with a ``failure``); otherwise ``str(error)``.
    """
    if isinstance(error, InsufficientMemoryError) and error.reason is not None:
        return _shortfall(error, names)
    if isinstance(error, KVCacheAllocationError) and error.failure is not None:
        return _allocation_failure(error, names)
    if isinstance(error, GroupLimitError):
        return _group_limit(error, names)
    if isinstance(error, MultiplePoolsError) and error.num_pools is not None:
        return _pool_counts(error, names)
    return str(error)


def with_message(error: _Error) -> _Error:
    """``error`` with its message rendered for a Python caller from its figures; what kvcore
    raises. An error without the figures keeps its own message.

    Args:
        error: the error, built with its figures and no message.

    Returns:
        The same error object.
    """
    error.args = (render(error),)
    return error


def _pool_counts(error: MultiplePoolsError, names: ParameterNames) -> str:
    pools = error.num_pools or 0
    counts = error.forced_counts or 0
    # a Python caller passes a tuple, the command line a comma-separated list
    each = ", ".join(["N"] * pools) if names.num_blocks == "num_blocks" else ",".join(["N"] * pools)
    shown = f"({each})" if names.num_blocks == "num_blocks" else each
    return (
        f"policy {error.policy!r} makes {plural(pools, 'block pool')} but {plural(counts, 'block count')} "
        f"{'was' if counts == 1 else 'were'} forced; give one count per pool "
        f"({names.setting(names.num_blocks, shown)})"
    )


def _counts(counts: tuple[int, ...], names: ParameterNames) -> str:
    """Block counts of several pools as a caller writes them: ``(1200, 340)`` in Python,
    ``1200,340`` on the command line."""
    if names.num_blocks == PYTHON_NAMES.num_blocks:
        return f"({', '.join(map(str, counts))})"
    return ",".join(map(str, counts))


def _shortfall(error: InsufficientMemoryError, names: ParameterNames) -> str:
    required = plural(error.required_blocks or 0, "block")
    available = plural(error.available_blocks or 0, "block")
    if error.bytes_per_block is None and error.required_blocks is not None:
        # a plan of several pools: block ids of different sizes
        block = "several pools' sizes"
    else:
        block = format_bytes(error.bytes_per_block or 0)
    required_each = error.required_pool_blocks
    available_each = error.available_pool_blocks
    if error.reason == "forced_num_blocks" and required_each is not None:
        text = (
            f"{names.setting(names.num_blocks, _counts(required_each, names))} needs "
            f"{format_bytes(error.required_bytes)} ({plural(len(required_each), 'pool')}, {required} in all) "
            f"but only {format_bytes(error.available_bytes)} is available; in those proportions at most "
            f"{_counts(available_each, names) if available_each is not None else available} fit: lower "
            f"{names.num_blocks} or {names.more_memory()}"
        )
    elif error.reason == "forced_num_blocks":
        text = (
            f"{names.setting(names.num_blocks, error.required_blocks)} needs "
            f"{format_bytes(error.required_bytes)} ({required} of {block}) but only "
            f"{format_bytes(error.available_bytes)} is available; at most {available} fit: lower "
            f"{names.num_blocks} or {names.more_memory()}"
        )
    else:
        if error.reason == "num_blocks" and required_each is not None and available_each is not None:
            have = (
                f"{names.setting(names.num_blocks, _counts(available_each, names))} holds "
                f"{format_bytes(error.available_bytes)}"
            )
            fix = f"raise {names.num_blocks} to at least {_counts(required_each, names)}"
        elif error.reason == "num_blocks":
            have = (
                f"{names.setting(names.num_blocks, error.available_blocks)} holds "
                f"{format_bytes(error.available_bytes)}"
            )
            fix = f"raise {names.num_blocks} to at least {error.required_blocks}"
        elif required_each is not None and available_each is not None:  # several pools
            pairs = zip(required_each, available_each, strict=True)
            short = [str(pool) for pool, (need, have_) in enumerate(pairs) if have_ < need]
            where_short = f"; short in pool {' and '.join(short)}" if short else ""
            have = (
                f"only {format_bytes(error.available_bytes)} is available (blocks per pool: "
                f"{', '.join(map(str, available_each))}{where_short})"
            )
            fix = names.more_memory()
        else:
            have = f"only {format_bytes(error.available_bytes)} is available ({available} of {block})"
            fix = names.more_memory()
        largest = error.largest_fitting_len
        fits = (
            f"the largest max_model_len that fits is {largest}; lower {names.max_model_len} to {largest} "
            f"or {fix}"
            if largest > 0
            else f"not even a one-token request fits; {fix}"
        )
        needed = (
            f"blocks per pool: {', '.join(map(str, required_each))}"
            if required_each is not None
            else f"{required} of {block}"
        )
        text = (
            f"one request of {error.max_model_len} tokens needs {format_bytes(error.required_bytes)} of KV "
            f"cache ({needed}) but {have}; {fits}"
        )
    return f"{error.where}: {text}" if error.where else text


def _allocation_failure(error: KVCacheAllocationError, names: ParameterNames) -> str:
    free = format_bytes(error.free_bytes) if error.free_bytes is not None else "an unknown amount"
    return (
        f"allocating the KV cache on {error.device} failed after {format_bytes(error.allocated_bytes)} of "
        f"{format_bytes(error.requested_bytes)} in {error.num_allocations} allocation(s) ({error.failure}); "
        f"everything was released and {free} is free now: plan for less memory (a lower "
        f"{names.utilization} or {names.memory})"
    )


def _group_limit(error: GroupLimitError, names: ParameterNames) -> str:
    return (
        f"policy {error.policy!r} cannot plan these layers in at most "
        f"{plural(error.max_groups, 'group')} ({names.setting(names.max_groups, error.max_groups)}): "
        f"its fewest is {plural(error.smallest_groups, 'group')} (one per retention kind at least); "
        f"raise {names.max_groups} to {error.smallest_groups} or more"
    )


def did_you_mean(name: str, choices: Iterable[str], *, most: int = 3) -> str:
    """The closest of ``choices`` to a ``name`` nobody registered, worded for an error message:
    ``"did you mean 'shared_buffer'? "`` (up to ``most`` names, by ``difflib``'s similarity,
    case ignored), or ``""`` when none is close.

    Args:
        name: what was asked for.
        choices: the names that exist.
        most: the most names to offer.
    """
    by_folded: dict[str, str] = {}
    for choice in choices:
        by_folded.setdefault(choice.lower(), choice)
    # difflib's default cutoff (0.6): 'pagedattention' finds 'paged_attention', 'qwen' finds no 'llama'
    close = difflib.get_close_matches(name.lower(), list(by_folded), n=most)
    if not close:
        return ""
    # only those about as close as the closest: a shared prefix ('kvcore.policies.') is no likeness
    ratio = {c: difflib.SequenceMatcher(None, name.lower(), c).ratio() for c in close}
    close = [c for c in close if ratio[c] >= ratio[close[0]] - 0.05]
    return f"did you mean {' or '.join(repr(by_folded[c]) for c in close)}? "
