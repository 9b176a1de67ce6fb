"""A small continuous-batching engine on kvcore, for transformers causal LMs.

It uses kvcore's public API only, and shows every step an engine takes around a plan:

1. **start-up**: :class:`kvcore.LocalExecutor` scans the model's attention modules,
   :func:`kvcore.initialize_kv_caches` plans, allocates and binds each layer's cache view;
2. **attention**: :func:`paged_attention` is registered with ``transformers.AttentionInterface``;
   the model keeps its own projections, RoPE and norms, and hands every layer's queries, keys
   and values here, where K and V are written into the layer's pages and read back through the
   request's block table;
3. **scheduling**: each :meth:`Engine.step` gives running requests their next tokens (a prompt
   chunk, or one decode token), then admits waiting requests first come, first served, within
   the plan's ``max_num_batched_tokens`` (chunked prefill);
4. **preemption**: when the :class:`kvcore.BlockPool` is exhausted, the most recently admitted
   request gives all its pages back and waits to be recomputed;
5. **finishing**: a request that has its tokens frees its pages.

Two more: :meth:`Engine.attach_cached_prefix` (with ``prefix_caching=True``), where a new
request picks up the cached blocks of a prefix it shares with earlier requests
(:meth:`kvcore.BlockPool.attach_prefix`), and :meth:`Engine.rollback`, where a speculative
decoder returns the pages of rejected tokens (:meth:`kvcore.BlockPool.truncate`).

Plain torch ops, written to be read, not to be fast. The attention math itself (transformers'
eager attention, each query seeing the keys its layer's spec allows) is the one kvcore's
reference runner uses (:mod:`kvcore.testing.reference.attention`), and so is the reading of
transformers' attention call (:mod:`kvcore.testing.reference.transformers_attention`); what is
the engine's own is where K and V go: into pages, and back, through block tables. Run
``python examples/engine/engine.py`` for a demo on a tiny random Llama.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from kvcore import (
    NULL_PAGE,
    BlockPool,
    BlockPoolExhaustedError,
    InvalidInputError,
    KVCachePlan,
    LocalExecutor,
    PlanOptions,
    Registry,
    SizingContext,
    initialize_kv_caches,
)
from kvcore.plugins.attention import AttentionSpec
from kvcore.testing.reference.attention import masked_attention, visibility, visible_start
from kvcore.testing.reference.transformers_attention import STEP_KWARG, AttentionCall, paged_attention_forward

#: The ``attn_implementation`` name the engine registers with transformers.
ATTENTION_NAME = "kvcore_example_engine"


@dataclass
class Request:
    """A request to decode greedily: its prompt, what it produced, and how far its cache goes."""

    request_id: Hashable
    prompt: list[int]
    max_new_tokens: int
    output: list[int] = field(default_factory=list)
    num_computed: int = 0  # tokens whose K and V are in the cache
    num_preemptions: int = 0
    #: prompt then output, one list kept up to date: the pool's prefix cache reads it again to
    #: hash the blocks the request fills later
    history: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.history = [*self.prompt, *self.output]

    @property
    def tokens(self) -> list[int]:
        return self.history

    def append(self, token: int) -> None:
        """Record a sampled token."""
        self.output.append(token)
        self.history.append(token)

    def drop(self, count: int) -> None:
        """Forget the last ``count`` output tokens (rejected speculative tokens)."""
        del self.output[len(self.output) - count :]
        del self.history[len(self.history) - count :]

    @property
    def finished(self) -> bool:
        return len(self.output) >= self.max_new_tokens


@dataclass
class Layer:
    """One attention layer as the engine sees it: its group's block table and its K and V pages."""

    group: int
    spec: AttentionSpec
    keys: torch.Tensor  # (num_pages, block_size, num_kv_heads, head_size), a view of kvcore's cache
    values: torch.Tensor


@dataclass
class Slice:
    """One request's tokens in a step: where they sit in the packed batch, and its block tables."""

    request: Request
    offset: int  # first token in the packed sequence
    start: int  # its position in the request
    count: int
    tables: list[torch.Tensor]  # one per group: entry k is the page of tokens k*B .. k*B+B-1


@dataclass
class Step:
    """What every attention call of one forward pass sees (passed as the model call's
    ``STEP_KWARG``)."""

    engine: Engine
    slices: list[Slice]

    def attend(self, call: AttentionCall) -> torch.Tensor:
        return self.engine.attend(call, self)


def paged_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    **knobs: Any,
) -> tuple[torch.Tensor, None]:
    """The function transformers calls for every attention layer.

    ``query`` is ``(1, num_heads, T, head_size)``, ``key`` and ``value`` ``(1, num_kv_heads, T,
    head_size)``: the step's tokens of every request, packed, after RoPE. transformers builds no
    mask for an implementation it has no mask function for, so ``attention_mask`` is ``None``
    and the layer's kvcore spec says which keys a query sees. ``knobs`` are the layer's
    ``scaling``, ``softcap``, ``sliding_window`` and ``s_aux`` (attention sinks), and the engine
    step. With a step, kvcore's reference function reads them as transformers' signature gives
    them (:func:`~kvcore.testing.reference.transformers_attention.paged_attention_forward`: the
    defaults resolved into an ``AttentionCall``) and hands the call to :meth:`Step.attend`.
    Returns ``(1, T, num_heads, head_size)``, as eager attention does.
    """
    if knobs.get(STEP_KWARG) is None:  # the profile run, or a call outside the engine: no cache
        causal = _eager(
            query, key, value, knobs.get("scaling"), knobs.get("softcap"), knobs.get("sliding_window"),
            knobs.get("s_aux"),
        )  # fmt: skip
        return causal, None
    return paged_attention_forward(module, query, key, value, attention_mask, **knobs)


def _eager(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    scaling: float | None,
    softcap: float | None,
    window: int | None,
    sinks: torch.Tensor | None,
) -> torch.Tensor:
    """Causal attention of one packed sequence without a cache (what the profile run needs)."""
    positions = torch.arange(query.shape[2], device=query.device)
    first = (positions - window + 1).clamp(min=0) if window is not None else torch.zeros_like(positions)
    seen = (positions[None, :] <= positions[:, None]) & (positions[None, :] >= first[:, None])
    scale = scaling if scaling is not None else query.shape[-1] ** -0.5
    keys, values = key[0].transpose(0, 1), value[0].transpose(0, 1)
    out = masked_attention(query[0], keys, values, seen, scaling=scale, softcap=softcap, sinks=sinks)
    return out.unsqueeze(0)


class Engine:
    """Greedy continuous batching of a transformers causal LM on caches kvcore planned.

    Args:
        model: the model (``eval()`` mode); its attention implementation is switched to
            :data:`ATTENTION_NAME`.
        max_model_len: the longest request (prompt plus output) the plan must hold.
        max_num_batched_tokens: tokens per step (the plan is sized for it).
        kv_cache_bytes: the KV-cache budget (a fixed size; an engine on a GPU would profile).
        num_blocks: force this many block ids (a small pool makes preemption happen).
        block_size: tokens per block of every attention layer.
        policy: the kvcore policy (``"auto"``, ``"shared_buffer"``, ``"equal_groups"``, ...).
        options: kvcore plan options (``uniform_block_size``, ``max_groups``, ...).
        device: where the caches go (the model must be there).
        registry: kvcore's registry; default the built-ins and installed plugins.
        prefix_caching: share the cached blocks of equal leading tokens across requests (the
            pool's prefix cache); a new or readmitted request starts after its cached prefix.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        *,
        max_model_len: int,
        max_num_batched_tokens: int,
        kv_cache_bytes: int = 1 << 24,
        num_blocks: int | None = None,
        block_size: int = 16,
        policy: str = "auto",
        options: PlanOptions | None = None,
        device: str = "cpu",
        registry: Registry | None = None,
        prefix_caching: bool = False,
    ) -> None:
        from transformers import AttentionInterface

        registry = registry if registry is not None else Registry.default()
        # 1. start-up: scan the modules, plan, allocate and bind (module.kv_cache = its view)
        self.executor = LocalExecutor(
            model,
            device,
            registry=registry,
            scan_options={"block_size": block_size},
            kv_cache_bytes=kv_cache_bytes,
        )
        context = SizingContext(max_model_len=max_model_len, max_num_batched_tokens=max_num_batched_tokens)
        self.plan: KVCachePlan = initialize_kv_caches(
            self.executor,
            registry=registry,
            policy=policy,
            context=context,
            options=options,
            num_blocks=num_blocks,
        )
        self.model = model
        self.pool = BlockPool(self.plan, prefix_caching=prefix_caching)
        self.budget = max_num_batched_tokens
        # every layer reads its group's block table; a KV-sharing layer reads its target's
        self.layers: dict[int, Layer] = {}
        for index, group in enumerate(self.plan.groups):
            if not isinstance(group.spec, AttentionSpec):
                raise ValueError(
                    f"group {index} is {group.spec.kind!r}; this engine attends over attention only"
                )
            for name in self.plan.block_table_layers(index):
                view = self.executor.kv_caches[name]  # (2, num_pages, block_size, num_kv_heads, head_size)
                module = self.executor.bound[name]
                self.layers[id(module)] = Layer(group=index, spec=group.spec, keys=view[0], values=view[1])
        # 2. attention: transformers calls paged_attention for every layer
        AttentionInterface.register(ATTENTION_NAME, paged_attention)
        self.previous_attn_implementation = getattr(model.config, "_attn_implementation", None)
        model.set_attn_implementation(ATTENTION_NAME)  # type: ignore[operator]
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []  # in admission order
        self.finished: dict[Hashable, Request] = {}
        self.num_steps = 0
        self.num_preemptions = 0

    # -- the API ------------------------------------------------------------------------------

    def add_request(self, request_id: Hashable, prompt: Sequence[int], max_new_tokens: int) -> None:
        """Queue a request; it is admitted when the pool has room for its first chunk."""
        self.waiting.append(Request(request_id, list(prompt), max_new_tokens))

    def generate(self) -> dict[Hashable, list[int]]:
        """Run steps until every request has its tokens; ``{request: generated tokens}``."""
        while self.waiting or self.running:
            self.step()
        return {rid: request.output for rid, request in self.finished.items()}

    def step(self) -> list[Request]:
        """One engine step: schedule, run the model once, sample, free what finished.

        Returns:
            The requests that finished in this step.
        """
        scheduled = self.schedule()
        logits = self.forward(scheduled)
        done = []
        for (request, count), row in zip(scheduled, logits, strict=True):
            request.num_computed += count
            if request.num_computed < len(request.tokens):
                continue  # a prompt chunk (or a recomputation) that has more to come
            request.append(int(torch.argmax(row)))  # greedy, like generate(do_sample=False)
            if request.finished:  # 5. finishing: give every page back
                self.pool.free_request(request.request_id)
                self.running.remove(request)
                self.finished[request.request_id] = request
                done.append(request)
        self.num_steps += 1
        return done

    def close(self) -> int:
        """Give the caches back (:meth:`kvcore.LocalExecutor.release`) and put the model's
        previous attention implementation back; returns the bytes released."""
        self.layers.clear()  # the engine's own references to the views go first
        if self.previous_attn_implementation is not None:
            self.model.set_attn_implementation(self.previous_attn_implementation)  # type: ignore[operator]
        return self.executor.release()

    # -- 3. scheduling -------------------------------------------------------------------------

    def schedule(self) -> list[tuple[Request, int]]:
        """This step's requests and how many tokens each computes, with their pages reserved."""
        budget = self.budget
        scheduled: list[tuple[Request, int]] = []
        index = 0
        while index < len(self.running) and budget > 0:  # running requests first, oldest first
            request = self.running[index]
            count = min(len(request.tokens) - request.num_computed, budget)
            if self.reserve(request, count):
                scheduled.append((request, count))
                budget -= count
                index += 1
                continue
            victim = self.running[-1]  # 4. preemption: the latest admitted gives its pages back
            self.preempt(victim)
            if victim is request:
                break
        while self.waiting and budget > 0:  # then new requests, first come, first served
            request = self.waiting[0]
            if request.request_id not in self.pool.requests:
                request.num_computed = self.attach_cached_prefix(request)
            count = min(len(request.tokens) - request.num_computed, budget)
            if not self.reserve(request, count):
                break  # no room for its first chunk: it waits until pages come back
            self.waiting.popleft()
            self.running.append(request)
            scheduled.append((request, count))
            budget -= count
        if not scheduled:
            raise RuntimeError(
                f"request {self.waiting[0].request_id!r} does not fit in the pool even alone; "
                "plan more blocks"
            )
        return scheduled

    def reserve(self, request: Request, count: int) -> bool:
        """Free the pages no later token reads (outside a sliding window or chunk), then take the
        pages ``count`` more tokens need. ``False`` when the pool is exhausted (nothing taken)."""
        rid = request.request_id
        if rid in self.pool.requests:
            self.pool.release_stale(rid, request.num_computed)
        try:
            self.pool.reserve(rid, request.num_computed + count)
        except BlockPoolExhaustedError:
            return False
        return True

    def preempt(self, request: Request) -> None:
        """Free all of ``request``'s pages; it waits at the head of the queue and is recomputed
        (prompt and the tokens it produced) when readmitted."""
        if request.request_id in self.pool.requests:
            self.pool.free_request(request.request_id)
        request.num_computed = 0
        request.num_preemptions += 1
        self.num_preemptions += 1
        self.running.remove(request)
        self.waiting.appendleft(request)

    def attach_cached_prefix(self, request: Request) -> int:
        """PREFIX CACHING: give a new (or readmitted) request the cached blocks of the longest
        prefix it shares with earlier requests, and return how many tokens they hold (the
        engine computes from there). The pool hashes the request's full blocks per group and
        attaches the hits to its tables; without ``prefix_caching`` nothing is cached."""
        if not self.pool.prefix_caching:
            return 0
        return self.pool.attach_prefix(request.request_id, request.history, len(request.history))

    def rollback(self, request_id: Hashable, num_rejected: int) -> None:
        """ROLLBACK: drop the last ``num_rejected`` tokens of a request (rejected speculative
        tokens) and give back the pages past its new length with the pool's ``truncate``. When
        a window already let go of a page the shorter request reads again (this engine calls
        ``release_stale`` before it knows what is rejected), the request is recomputed from
        its remaining tokens instead: correct, only slower."""
        request = next(r for r in (*self.running, *self.waiting) if r.request_id == request_id)
        keep = len(request.output) - num_rejected
        if keep < 0:
            raise ValueError(
                f"request {request_id!r} has {len(request.output)} tokens, cannot reject {num_rejected}"
            )
        request.drop(num_rejected)
        length = len(request.tokens) - 1  # the last token is computed by the next step
        if request.num_computed > length and request_id in self.pool.requests:
            try:
                self.pool.truncate(request_id, length)
                request.num_computed = length
                return
            except InvalidInputError:
                # a window or chunk already let go of a page the shorter request reads again
                # (release_stale counted the rejected tokens): recompute instead
                pass
        if request.num_computed > length:
            if request_id in self.pool.requests:
                self.pool.free_request(request_id)
            request.num_computed = 0

    # -- 2. the model and attention ---------------------------------------------------------------

    def forward(self, scheduled: list[tuple[Request, int]]) -> list[torch.Tensor]:
        """Run the model once over every scheduled request's tokens, packed into one sequence;
        the logits of each request's last token."""
        slices: list[Slice] = []
        ids: list[int] = []
        positions: list[int] = []
        for request, count in scheduled:
            start = request.num_computed
            tables = [
                torch.tensor(self.pool.block_table(request.request_id, g), dtype=torch.long)
                for g in range(len(self.plan.groups))
            ]
            slices.append(Slice(request=request, offset=len(ids), start=start, count=count, tables=tables))
            ids.extend(request.tokens[start : start + count])
            positions.extend(range(start, start + count))
        device = next(self.model.parameters()).device
        with torch.no_grad():
            output = self.model(
                input_ids=torch.tensor([ids], device=device),
                position_ids=torch.tensor([positions], device=device),
                use_cache=False,
                **{STEP_KWARG: Step(engine=self, slices=slices)},
            )
        return [output.logits[0, s.offset + s.count - 1].float() for s in slices]

    def attend(self, call: AttentionCall, step: Step) -> torch.Tensor:
        """Write the step's K and V into the layer's pages, then attend over the pages, per request."""
        module, query, key, value, sinks = call.module, call.query, call.key, call.value, call.sinks
        layer = self.layers[id(module)]
        size = layer.spec.block_size
        output = query.new_empty(query.shape[2], query.shape[1], query.shape[3])
        for part in step.slices:
            new = slice(part.offset, part.offset + part.count)
            table = part.tables[layer.group]
            # write: token position p lives in page table[p // B], slot p % B
            positions = torch.arange(part.start, part.start + part.count)
            pages, slots = table[positions // size], positions % size
            layer.keys[pages, slots] = key[0, :, new].transpose(0, 1).to(layer.keys.dtype)
            layer.values[pages, slots] = value[0, :, new].transpose(0, 1).to(layer.values.dtype)
            # read back every key a query of this step sees, by block table
            first = visible_start(layer.spec, part.start)
            context = torch.arange(first, part.start + part.count)
            pages = table[context // size]
            assert not bool((pages == NULL_PAGE).any()), (
                "a freed page is still read: the pool freed too early"
            )
            keys, values = layer.keys[pages, context % size], layer.values[pages, context % size]
            # each query sees the keys up to itself from where the spec's window or chunk starts
            seen = visibility(layer.spec, part.start, part.count, first, len(context))
            output[new] = masked_attention(
                query[0, :, new], keys, values, seen, scaling=call.scaling, softcap=call.softcap, sinks=sinks
            )
        return output.unsqueeze(0)


def main() -> None:
    """Three requests on a tiny random Llama, in a pool too small for all of them at once."""
    import transformers

    config = transformers.LlamaConfig(
        hidden_size=32, intermediate_size=64, num_attention_heads=4, num_key_value_heads=2,
        head_dim=8, num_hidden_layers=2, vocab_size=128,
    )  # fmt: skip
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config)
    model.eval()  # type: ignore[no-untyped-call]
    engine = Engine(model, max_model_len=64, max_num_batched_tokens=16, block_size=4, num_blocks=24)
    for i, length in enumerate((20, 9, 14)):
        engine.add_request(f"r{i}", torch.randint(3, 128, (length,)).tolist(), max_new_tokens=24)
    outputs = engine.generate()
    plan = engine.plan
    print(f"plan: {plan.num_blocks} blocks, {len(plan.groups)} group(s), policy {plan.policy}")
    free = engine.pool.num_free_blocks
    print(f"{engine.num_steps} steps, {engine.num_preemptions} preemption(s), {free} blocks free")
    for rid, tokens in outputs.items():
        print(rid, tokens[:8], "...")


if __name__ == "__main__":
    main()
