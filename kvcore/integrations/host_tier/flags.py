"""The engine flags that set a plan's host tier, and what each engine really allocates for them.

A kvcore plan's :class:`~kvcore.plan.OffloadTier` says how many host bytes (and so block ids)
each rank keeps off the device. The engines take the amount in their own units and round it
their own way; :func:`host_tier_flags` gives, for a plan's tier, the flag value of each and the
bytes and blocks (or tokens) the engine then allocates, worked out as its source does
(``docs/reference/host-tier-flags.md`` cites the lines):

- **vLLM 0.33** ``--kv-offloading-size GiB`` (``--kv-offloading-backend native``): the GiB of
  every rank together become ``cpu_bytes_to_use``; one host *chunk* holds one block of every
  rank (``worker_kv_bytes_per_block x world_size``, rounded up to the 4 KiB page), and vLLM
  keeps ``cpu_bytes_to_use // chunk`` chunks in one shared-memory region.
- **SGLang 0.5.23** ``--enable-hierarchical-cache`` with ``--hicache-size GB`` (an integer, in
  1e9 bytes, per rank) or ``--hicache-ratio R`` (host tokens per device token): host tokens are
  ``GB x 1e9 // bytes per token`` (or ``device tokens x R``), plus one padding page.
- **LMCache** ``max_local_cpu_size`` (GiB per rank, a float): ``int(size x 1024**3)`` bytes of
  pinned memory, in chunks of ``chunk_size`` tokens (256 by default).

Planning only: nothing here imports an engine or torch.
"""

from __future__ import annotations

import math

import attrs

from kvcore.errors import InvalidInputError
from kvcore.plan import KVCachePlan
from kvcore.units import format_bytes

_GIB = 1 << 30
_GB = 10**9
#: vLLM's host region rounds each chunk up to the OS page (``mmap.PAGESIZE``, 4 KiB on Linux).
VLLM_CHUNK_ALIGNMENT = 4096
#: LMCache's default tokens per chunk (``chunk_size``).
LMCACHE_CHUNK_SIZE = 256
#: Decimal places the GiB flags are given with (rounded up, so the engine gets at least the tier).
_PLACES = 6


@attrs.frozen(kw_only=True)
class EngineHostTier:
    """One engine's setting for a host tier, and what the engine allocates for it.

    Attributes:
        engine: ``"vllm"``, ``"sglang"`` or ``"lmcache"``.
        flags: the settings, as written on the engine's command line or config file.
        allocated_bytes: host bytes the engine allocates for them, every rank together.
        holds: what those bytes hold, in the engine's unit (``"blocks"``, ``"tokens"``).
        holds_count: how many of them, per rank.
        notes: how the figure was worked out.
    """

    engine: str
    flags: tuple[str, ...]
    allocated_bytes: int
    holds: str
    holds_count: int
    notes: str


def _round_up(value: float) -> float:
    scale = 10**_PLACES
    return float(math.ceil(value * scale) / scale)


def _decimal(value: float) -> str:
    """``value`` as written on a command line: every one of its :data:`_PLACES` decimals that is
    not a trailing zero (``127.999268``, ``128``), never an exponent."""
    return f"{value:.{_PLACES}f}".rstrip("0").rstrip(".")


def _tier_bytes(plan: KVCachePlan, **counts: int) -> int:
    """The bytes of the plan's host tier (one pool's), once each of ``counts`` (``world_size``
    and the engine's own, by keyword) is checked to be at least 1."""
    tier = plan.offload_tier
    if tier is None:
        raise InvalidInputError(
            "the plan has no host tier; give it one (kvcore.planning.offload.with_host_memory)"
        )
    if not plan.runs_in_one_pool:
        raise InvalidInputError(
            f"the plan has {len(plan.pools)} block pools; vLLM, SGLang and LMCache size one host tier for "
            "one KV cache, so plan for them with one pool (not kind_pools)"
        )
    if any(value < 1 for value in counts.values()):
        got = ", ".join(str(value) for value in counts.values())
        raise InvalidInputError(f"{' and '.join(counts)} must be >= 1 (got {got})")
    return tier.nbytes


def _token_bytes(plan: KVCachePlan) -> int:
    """Bytes one token takes in every layer of one rank, for engines that count host memory in
    tokens; only for a plan whose layers all keep every token in order (full attention, MLA):
    SGLang and LMCache give windowed and state layers pools of their own."""
    total = 0
    for group in plan.groups:
        spec = group.spec
        per_page = spec.tokens_per_page
        key = spec.retention_key
        # a kind that keeps every token in order keys its retention so (KVCacheSpec.retention_key)
        if per_page is None or not (isinstance(key, tuple) and key[:1] == ("keeps every token",)):
            raise InvalidInputError(
                f"group of {spec.kind} layers: SGLang and LMCache count host memory in tokens of layers that "
                "keep every token (full attention, MLA); this plan's token count would be wrong for them"
            )
        total += sum(group.spec_of(name).page_size_bytes for name in group.layer_names) // per_page
    return total


def vllm_host_tier(plan: KVCachePlan, *, world_size: int = 1) -> EngineHostTier:
    """vLLM's ``--kv-offloading-size`` for the plan's tier, and what vLLM allocates.

    Args:
        plan: one rank's plan, with its host tier; every rank of the engine has its shape.
        world_size: ranks of the engine (tensor x pipeline parallel): vLLM's size counts all.

    Raises:
        InvalidInputError: no tier, several pools, or a world size below 1.
    """
    tier_bytes = _tier_bytes(plan, world_size=world_size)
    blocks = plan.host_blocks_in(0)
    chunk = -(-plan.bytes_per_block * world_size // VLLM_CHUNK_ALIGNMENT) * VLLM_CHUNK_ALIGNMENT
    size_gib = _round_up(blocks * chunk / _GIB)
    chunks = int(size_gib * _GIB) // chunk  # vLLM: int(cpu_bytes_to_use) // aligned chunk
    return EngineHostTier(
        engine="vllm",
        flags=(f"--kv-offloading-size {_decimal(size_gib)}", "--kv-offloading-backend native"),
        allocated_bytes=chunks * chunk,
        holds="blocks",
        holds_count=chunks,
        notes=(
            f"{_decimal(size_gib)} GiB for all {world_size} rank(s) = {int(size_gib * _GIB):,} bytes; "
            f"a chunk is one block of every rank, {plan.bytes_per_block:,} x {world_size} bytes rounded "
            f"up to {VLLM_CHUNK_ALIGNMENT:,}: {chunk:,}; {chunks:,} chunks = "
            f"{format_bytes(chunks * chunk)} in one /dev/shm region "
            f"(the tier asks {blocks:,} blocks, {format_bytes(tier_bytes)} a rank)"
        ),
    )


def sglang_host_tier(
    plan: KVCachePlan, *, world_size: int = 1, page_size: int = 1
) -> tuple[EngineHostTier, ...]:
    """SGLang's ``--hicache-size`` and ``--hicache-ratio`` for the plan's tier, and what each
    allocates (host tokens, one padding page included).

    Args:
        plan: one rank's plan, with its host tier, of layers that keep every token.
        world_size: ranks; SGLang's flags are per rank, its bytes here all ranks'.
        page_size: SGLang's ``--page-size`` (tokens per page; 1 by default).

    Raises:
        InvalidInputError: no tier, several pools, windowed or state layers, bad sizes.
    """
    tier_bytes = _tier_bytes(plan, world_size=world_size, page_size=page_size)
    per_token = _token_bytes(plan)
    wanted_tokens = tier_bytes // per_token
    gb = -(-tier_bytes // _GB)  # --hicache-size is an int of GB: round up to hold the tier
    by_size = (gb * _GB // per_token // page_size + 1) * page_size
    device_tokens = plan.usable_blocks * plan.groups[0].spec.block_size
    ratio = _round_up(wanted_tokens / device_tokens)
    by_ratio = (int(device_tokens * ratio) // page_size + 1) * page_size

    def hicache(flag: str, tokens: int, notes: str) -> EngineHostTier:
        # either flag sizes a host pool of ``tokens`` tokens on every rank
        return EngineHostTier(
            engine="sglang",
            flags=("--enable-hierarchical-cache", flag),
            allocated_bytes=tokens * per_token * world_size,
            holds="tokens",
            holds_count=tokens,
            notes=notes,
        )

    return (
        hicache(
            f"--hicache-size {gb}",
            by_size,
            f"{gb} GB = {gb * _GB:,} bytes a rank // {per_token:,} bytes a token = "
            f"{by_size - page_size:,} tokens, plus a padding page of {page_size}: {by_size:,} tokens = "
            f"{format_bytes(by_size * per_token)} a rank (the tier asks {wanted_tokens:,} tokens)",
        ),
        hicache(
            f"--hicache-ratio {_decimal(ratio)}",
            by_ratio,
            f"{device_tokens:,} device tokens x {_decimal(ratio)}, plus a padding page of "
            f"{page_size}: {by_ratio:,} tokens = {format_bytes(by_ratio * per_token)} a rank",
        ),
    )


def lmcache_host_tier(
    plan: KVCachePlan, *, world_size: int = 1, chunk_size: int = LMCACHE_CHUNK_SIZE
) -> EngineHostTier:
    """LMCache's ``max_local_cpu_size`` for the plan's tier, and what it allocates.

    Args:
        plan: one rank's plan, with its host tier, of layers that keep every token.
        world_size: ranks; each runs its own LMCache engine with this size.
        chunk_size: LMCache's ``chunk_size`` (tokens a stored chunk holds).

    Raises:
        InvalidInputError: no tier, several pools, windowed or state layers, bad sizes.
    """
    tier_bytes = _tier_bytes(plan, world_size=world_size, chunk_size=chunk_size)
    per_token = _token_bytes(plan)
    size_gib = _round_up(tier_bytes / _GIB)
    allocated = int(size_gib * _GIB)  # LMCache: int(max_local_cpu_size * 1024**3), pinned
    chunk = chunk_size * per_token
    chunks = allocated // chunk
    return EngineHostTier(
        engine="lmcache",
        flags=(f"max_local_cpu_size: {_decimal(size_gib)}", f"chunk_size: {chunk_size}"),
        allocated_bytes=allocated * world_size,
        holds="tokens",
        holds_count=chunks * chunk_size,
        notes=(
            f"{_decimal(size_gib)} GiB = {allocated:,} bytes of pinned memory a rank; chunks of "
            f"{chunk_size} tokens x {per_token:,} bytes: at most {chunks:,} chunks, "
            f"{chunks * chunk_size:,} tokens"
        ),
    )


@attrs.frozen(kw_only=True)
class HostTierFlags:
    """Every engine's setting for one plan's host tier.

    Attributes:
        settings: vLLM's, then SGLang's two (by size, by ratio), then LMCache's.
        not_computed: ``"engine: why"`` for each engine the plan's layers do not suit.
    """

    settings: tuple[EngineHostTier, ...]
    not_computed: tuple[str, ...] = ()


def host_tier_flags(
    plan: KVCachePlan,
    *,
    world_size: int = 1,
    sglang_page_size: int = 1,
    lmcache_chunk_size: int = LMCACHE_CHUNK_SIZE,
) -> HostTierFlags:
    """Every engine's setting for the plan's host tier (see the module's docstring). SGLang and
    LMCache count host memory in tokens of layers that keep every token; for another plan
    they are listed in ``not_computed`` with the reason.

    Raises:
        InvalidInputError: no tier, several pools, or a bad world size, page or chunk size.
    """
    settings = [vllm_host_tier(plan, world_size=world_size)]
    skipped = []
    try:
        settings += sglang_host_tier(plan, world_size=world_size, page_size=sglang_page_size)
    except InvalidInputError as exc:
        skipped.append(f"sglang: {exc}")
    try:
        settings.append(lmcache_host_tier(plan, world_size=world_size, chunk_size=lmcache_chunk_size))
    except InvalidInputError as exc:
        skipped.append(f"lmcache: {exc}")
    return HostTierFlags(settings=tuple(settings), not_computed=tuple(skipped))
