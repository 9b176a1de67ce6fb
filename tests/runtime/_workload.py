"""A scheduler-like workload over a plan, and the check that no two live pages share bytes.

Requests arrive, grow step by step (freeing what falls out of a window first, as a scheduler
does) and finish, all through :class:`kvcore.BlockPool`. Every page a request owns gets a fresh
random byte pattern in every layer of its group, written through the allocated views; after
every operation every live pattern must still be intact. Two live pages that overlap show up as
a pattern the other one overwrote.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from kvcore import BlockPool, BlockPoolExhaustedError, KVCachePlan, PartViews, Registry
from kvcore.runtime.allocation import allocate_buffers, allocation_sizes, build_views, view_geometries

#: ("arrive", tokens, _) | ("step", which request, tokens) | ("finish", which request, _)
Op = tuple[str, int, int]


class PatternChecker:
    """Random patterns in pages, written and checked through each layer's views."""

    def __init__(self, plan: KVCachePlan, registry: Registry, views: dict, seed: int = 0) -> None:
        self.generator = torch.Generator().manual_seed(seed)
        # per group: [(layer, part, page-major uint8 view, shadow copy, live mask)]
        self.lanes: list[list[tuple[str, str, torch.Tensor, torch.Tensor, torch.Tensor]]] = []
        for group in plan.groups:
            lanes = []
            for name in group.layer_names:
                parts = registry.cache_layout(group.spec_of(name)).parts  # a mixed-page group's own
                view = views[name]
                tensors = list(view) if isinstance(view, PartViews) else [view]
                for part, tensor in zip(parts, tensors, strict=True):
                    pages = tensor.movedim(part.block_dim, 0).view(torch.uint8)
                    shadow = torch.zeros(pages.shape, dtype=torch.uint8)
                    live = torch.zeros(pages.shape[0], dtype=torch.bool)
                    lanes.append((name, part.name, pages, shadow, live))
            self.lanes.append(lanes)

    def acquire(self, group: int, pages: Sequence[int]) -> None:
        """Write a fresh pattern into ``pages`` of every layer of ``group``."""
        if not pages:
            return
        index = torch.tensor(list(pages))
        for _, _, view, shadow, live in self.lanes[group]:
            pattern = torch.randint(
                0, 256, (len(pages), *view.shape[1:]), dtype=torch.uint8, generator=self.generator
            )
            view[index.to(view.device)] = pattern.to(view.device)
            shadow[index] = pattern
            live[index] = True

    def release(self, group: int, pages: Sequence[int]) -> None:
        if pages:
            for *_, live in self.lanes[group]:
                live[torch.tensor(list(pages))] = False

    def check(self) -> list[str]:
        """Every live page whose bytes are no longer its pattern."""
        bad = []
        for group, lanes in enumerate(self.lanes):
            for name, part, view, shadow, live in lanes:
                differs = (view.cpu() != shadow).flatten(1).any(dim=1) & live
                for page in differs.nonzero().flatten().tolist():
                    bad.append(f"group {group} layer {name!r} part {part!r} page {page} was overwritten")
        return bad


def run_workload(
    plan: KVCachePlan,
    registry: Registry,
    ops: Sequence[Op],
    *,
    device: str = "cpu",
    pool_factory: Callable[[KVCachePlan], BlockPool] = BlockPool,
    seed: int = 0,
    check_accounting: bool = True,
) -> list[str]:
    """Drive ``ops`` through a pool over ``plan`` allocated on ``device``; return every problem seen.

    ``check_accounting`` also compares the pages requests hold with the pool's free count and
    each group's per-request bound (off when a test breaks the pool on purpose).
    """
    # Not allocate(): it refuses a plan that fails kvcore's own check, and this harness must
    # catch aliasing independently of that check (it allocates whatever the plan says).
    geometries = view_geometries(plan, registry=registry)
    views = build_views(geometries, allocate_buffers(allocation_sizes(plan), torch.device(device)))
    pool = pool_factory(plan)
    checker = PatternChecker(plan, registry, views, seed)
    context = plan.context
    computed: dict[int, int] = {}
    problems: list[str] = []
    next_id = 0

    def advance(request: int, tokens: int) -> None:
        have = computed[request]
        target = min(have + tokens, context.max_model_len)
        for group, pages in pool.release_stale(request, have).items():
            checker.release(group, pages)
        free_before = [pool.num_free_blocks_in(p) for p in range(len(plan.pools))]
        try:
            taken = pool.reserve(request, target)
        except BlockPoolExhaustedError:
            free_after = [pool.num_free_blocks_in(p) for p in range(len(plan.pools))]
            if free_after != free_before:
                problems.append(f"a failed reserve changed the free counts {free_before} -> {free_after}")
            return
        for group, pages in taken.items():
            checker.acquire(group, pages)
        computed[request] = target
        for index, group in enumerate(plan.groups if check_accounting else ()):
            held = len(pool.live_pages(request, index))
            if held > group.pages_per_request(context):
                problems.append(
                    f"request {request} holds {held} pages of group {index}, more than the "
                    f"{group.pages_per_request(context)} its spec allows at {target} tokens"
                )

    for kind, a, b in ops:
        live = sorted(computed)
        if kind == "arrive":
            computed[next_id] = 0
            pool.reserve(next_id, 0)
            advance(next_id, a)
            next_id += 1
        elif kind == "step" and live:
            advance(live[a % len(live)], b)
        elif kind == "finish" and live:
            request = live[a % len(live)]
            for group in range(len(plan.groups)):
                checker.release(group, pool.live_pages(request, group))
            pool.free_request(request)
            del computed[request]
        problems += checker.check()
        if check_accounting:
            held = sum(
                len(pool.live_pages(r, g)) * grp.blocks_per_page
                for r in computed
                for g, grp in enumerate(plan.groups)
            )
            in_use = pool.num_usable_blocks - pool.num_free_blocks
            if held != in_use:
                problems.append(f"requests hold {held} block ids but the pool counts {in_use} in use")
        if problems:
            break
    return problems
