"""The reference runner: a transformers model decoding on kvcore's caches through block tables.

:class:`PagedAttentionRunner` does, for one engine step, what a paged-attention engine does:

1. for every scheduled request, free the pages no later token reads
   (:meth:`kvcore.BlockPool.release_stale`, which follows ``spec.first_retained_token``: the
   pages that fell out of a sliding window or an earlier chunk), then grow its block tables to
   cover the step's tokens (:meth:`kvcore.BlockPool.reserve`);
2. run the model once on every request's new tokens, packed into one sequence with their own
   positions;
3. in each attention layer (transformers calls :func:`.transformers_attention.paged_attention_forward`),
   write each request's new K and V into the layer's bound view at the pages its block table
   names, read the request's visible context back from those pages and attend over it.

Every layer's view is the one :func:`kvcore.allocate` made and the engine bound to the layer's
module (``module.kv_cache``, as :class:`kvcore.LocalExecutor` binds it); layer names are the
modules' qualified names, which is how kvcore names a transformers model's layers
(``model.layers.3.self_attn``, from :func:`kvcore.scan_module` or the config families). Each
page taken and freed is recorded as a :class:`PageEvent`, so a test can see blocks reused
across requests and groups.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Final

import attrs
import torch

from kvcore.errors import InvalidInputError, KVCacheBindingError, SpecMismatchError
from kvcore.plan import KVCachePlan
from kvcore.plugins.attention import AttentionSpec
from kvcore.plugins.cross_attention import CrossAttentionSpec
from kvcore.plugins.sliding_window import SlidingWindowSpec
from kvcore.runtime.binding import layer_index
from kvcore.runtime.block_pool import BlockPool
from kvcore.spec import describe_spec
from kvcore.testing.reference.attention import (
    causal_attention,
    check_supported,
    encoder_attention,
    visible_start,
)
from kvcore.testing.reference.pages import LayerPages
from kvcore.testing.reference.requests import ScheduledRequest
from kvcore.testing.reference.transformers_attention import (
    ATTENTION_NAME,
    STEP_KWARG,
    AttentionCall,
    register_attention,
)

if TYPE_CHECKING:
    from kvcore.engine.local import LocalExecutor

#: Why a page changed hands (:attr:`PageEvent.action`).
TAKE: Final = "take"
STALE: Final = "stale"
FINISH: Final = "finish"


@attrs.frozen(kw_only=True)
class PageEvent:
    """A page that a request's group took or gave back.

    Attributes:
        step: the runner step (0-based) during which it happened.
        request_id: the request.
        group: the group index in the plan.
        page: the page (a block id for a one-block page).
        action: :data:`TAKE`, :data:`STALE` (freed: out of the window or chunk) or :data:`FINISH`.
    """

    step: int
    request_id: Hashable
    group: int
    page: int
    action: str


@attrs.frozen(kw_only=True, eq=False)
class BoundLayer:
    """A planned attention layer as the runner sees it.

    Attributes:
        name: the kvcore layer name (the module's qualified name).
        group: its group's index in the plan (which block table it reads).
        spec: its group's spec.
        pages: its K and V pages, views of the allocated cache.
    """

    name: str
    group: int
    spec: AttentionSpec
    pages: LayerPages


@attrs.frozen(kw_only=True, eq=False)
class _Slice:
    request_id: Hashable
    offset: int
    start: int
    num_tokens: int
    tables: tuple[torch.Tensor, ...]
    encoder_offset: int = 0
    encoder_tokens: int = 0


@attrs.frozen(kw_only=True, eq=False)
class StepContext:
    """One engine step as every attention call sees it (passed as :data:`STEP_KWARG`).

    Attributes:
        runner: the runner.
        index: the step number.
        slices: per request: its tokens' offset in the packed sequence, first position, count,
            and one block table per group (``int64``, :data:`~kvcore.NULL_PAGE` where freed).
    """

    runner: PagedAttentionRunner
    index: int
    slices: tuple[_Slice, ...]

    def attend(self, call: AttentionCall) -> torch.Tensor:
        """Write the step's K and V into the called module's pages and attend over them, per request.

        Returns:
            ``(1, T, num_heads, head_size)``.

        Raises:
            KVCacheBindingError: the module is not a planned layer.
            SpecMismatchError: transformers' window differs from the layer's spec.
            InvalidInputError: a batch dimension other than 1 (steps are packed), or a token
                whose page was freed.
        """
        query, key, value, window = call.query, call.key, call.value, call.sliding_window
        layer = self.runner.layer_of(call.module)
        if window is not None and not (
            isinstance(layer.spec, SlidingWindowSpec) and layer.spec.sliding_window == window
        ):
            raise SpecMismatchError(
                f"layer {layer.name!r}: transformers attends over a sliding window of {window} "
                f"tokens but the plan gives it {describe_spec(layer.spec)}; plan the specs of this model"
            )
        if query.shape[0] != 1:
            raise InvalidInputError(
                "the reference runner packs every request into one sequence (got a batch of "
                f"{query.shape[0]})"
            )
        output = query.new_empty(query.shape[2], query.shape[1], query.shape[3])
        if isinstance(layer.spec, CrossAttentionSpec):
            self._attend_encoder(layer, query, key, value, output, call.scaling)
            return output.unsqueeze(0)
        for part in self.slices:
            new = slice(part.offset, part.offset + part.num_tokens)
            table = part.tables[layer.group]
            layer.pages.write(
                table, part.start, key[0, :, new].transpose(0, 1), value[0, :, new].transpose(0, 1)
            )
            first = visible_start(layer.spec, part.start)
            keys, values = layer.pages.read(table, first, part.start + part.num_tokens)
            output[new] = causal_attention(
                query[0, :, new],
                keys,
                values,
                spec=layer.spec,
                query_start=part.start,
                key_start=first,
                scaling=call.scaling,
                softcap=call.softcap,
                sinks=call.sinks,
            )
        return output.unsqueeze(0)

    def _attend_encoder(
        self,
        layer: BoundLayer,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        output: torch.Tensor,
        scaling: float,
    ) -> None:
        """Cross attention: a request's encoder K and V go into its pages at its first step, and
        every step attends over what the pages hold (the K and V transformers recomputes from the
        encoder output are only written, never read)."""
        for part in self.slices:
            new = slice(part.offset, part.offset + part.num_tokens)
            table = part.tables[layer.group]
            if part.start == 0:
                encoder = slice(part.encoder_offset, part.encoder_offset + part.encoder_tokens)
                layer.pages.write(
                    table, 0, key[0, :, encoder].transpose(0, 1), value[0, :, encoder].transpose(0, 1)
                )
            keys, values = layer.pages.read(table, 0, part.encoder_tokens)
            output[new] = encoder_attention(query[0, :, new], keys, values, scaling=scaling)


def _check_layer_index(name: str, module: torch.nn.Module) -> None:
    """A transformers module's ``layer_idx`` must be the index in its kvcore layer name."""
    index = getattr(module, "layer_idx", None)
    if not isinstance(index, int):
        return
    try:
        named = layer_index(name)
    except KVCacheBindingError:
        return  # a name without one index (kvcore names need not have one)
    if named != index:
        raise KVCacheBindingError(
            f"layer {name!r} is bound to a {type(module).__name__} with layer_idx {index}; a layer's view "
            "must be bound to the module the name names"
        )


class PagedAttentionRunner:
    """Runs a transformers causal LM on kvcore-allocated, bound caches through a block pool.

    Args:
        model: the model (``eval()`` mode); its attention implementation is switched to
            :data:`~.transformers_attention.ATTENTION_NAME` (the previous one is kept in
            :attr:`previous_attn_implementation` and :meth:`restore` puts it back).
        plan: the plan the views were allocated for.
        modules: ``{layer: module}`` for every planned layer, each bound to its view
            (``LocalExecutor.bound`` after ``initialize_kv_caches``).
        attribute: the module attribute holding the view.
        pool: the block pool; default a fresh ``BlockPool(plan)``.

    Raises:
        KVCacheBindingError: a planned layer has no module, or a module holds no attention view
            of its group's spec.
        InvalidInputError: a layer's kind is not one the runner attends over, or transformers is
            missing.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        plan: KVCachePlan,
        modules: Mapping[str, torch.nn.Module],
        *,
        attribute: str = "kv_cache",
        pool: BlockPool | None = None,
    ) -> None:
        self.model = model
        self.plan = plan
        self.pool = pool if pool is not None else BlockPool(plan)
        self.events: list[PageEvent] = []
        self.num_steps = 0
        self._encoded: dict[Hashable, torch.Tensor] = {}
        self._layers: dict[int, BoundLayer] = {}
        for index, group in enumerate(plan.groups):
            for name in group.layer_names:
                spec = check_supported(name, group.spec_of(name))
                module = modules.get(name)
                if module is None:
                    raise KVCacheBindingError(
                        f"planned layer {name!r} has no module; pass the modules the views were bound to"
                    )
                view = getattr(module, attribute, None)
                if view is None:
                    raise KVCacheBindingError(
                        f"module {name!r} ({type(module).__name__}) has no {attribute!r} view; bind the "
                        "allocated views first (kvcore.bind_to_modules or LocalExecutor)"
                    )
                _check_layer_index(name, module)
                pages = LayerPages.from_view(name, view, spec, plan.num_pages(group))
                self._layers[id(module)] = BoundLayer(name=name, group=index, spec=spec, pages=pages)
        config: Any = getattr(model, "config", None)
        self.previous_attn_implementation: str | None = getattr(config, "_attn_implementation", None)
        setter = getattr(model, "set_attn_implementation", None)
        if not callable(setter):
            raise InvalidInputError(
                f"{type(model).__name__} is not a transformers model (no set_attn_implementation); the "
                "reference runner plugs in through transformers' AttentionInterface"
            )
        setter(register_attention())
        self._set_attn_implementation = setter
        #: Whether the model is an encoder-decoder (Whisper): requests bring encoder inputs
        #: (:meth:`encode`), and steps feed the decoder.
        self.encoder_decoder = bool(getattr(config, "is_encoder_decoder", False))
        self._encoder_limit = min(
            (g.spec.max_encoder_tokens for g in plan.groups if isinstance(g.spec, CrossAttentionSpec)),
            default=None,
        )

    @classmethod
    def from_executor(cls, executor: LocalExecutor, *, pool: BlockPool | None = None) -> PagedAttentionRunner:
        """A runner over what :func:`kvcore.initialize_kv_caches` set up on a :class:`kvcore.LocalExecutor`.

        Raises:
            InvalidInputError: the executor was not initialized yet.
        """
        if executor.plan is None:
            raise InvalidInputError(
                "the executor has no plan yet; run kvcore.initialize_kv_caches(executor, ...)"
            )
        return cls(executor.model, executor.plan, executor.bound, attribute=executor.attribute, pool=pool)

    def encode(self, request_id: Hashable, inputs: Mapping[str, Any]) -> None:
        """Run the encoder of an encoder-decoder model on a request's inputs, once, before its
        first step; its cross-attention layers cache the output at that step.

        Args:
            request_id: the request.
            inputs: the encoder's keyword arguments (``{"input_features": ...}`` for Whisper).

        Raises:
            InvalidInputError: the model is not an encoder-decoder, or the encoder output is
                longer than the plan's cross-attention layers hold.
        """
        if not self.encoder_decoder:
            name = type(self.model).__name__
            raise InvalidInputError(f"{name} is not an encoder-decoder model: it has no encoder to run")
        device = next(self.model.parameters()).device
        encoder: Any = self.model.get_encoder()  # type: ignore[operator]
        # the encoder caches nothing: it runs with the model's own attention
        previous = self.previous_attn_implementation
        self._set_attn_implementation(previous if previous not in (None, ATTENTION_NAME) else "eager")
        try:
            with torch.no_grad():
                encoded = encoder(**{k: v.to(device) for k, v in inputs.items()})
        finally:
            self._set_attn_implementation(register_attention())
        hidden = encoded.last_hidden_state[0]
        if self._encoder_limit is not None and hidden.shape[0] > self._encoder_limit:
            raise InvalidInputError(
                f"request {request_id!r}: the encoder output has {hidden.shape[0]} tokens but the plan's "
                f"cross-attention layers hold {self._encoder_limit}; plan with a larger max_encoder_tokens"
            )
        self._encoded[request_id] = hidden

    def restore(self) -> None:
        """Put the model's previous attention implementation back."""
        if self.previous_attn_implementation is not None:
            self._set_attn_implementation(self.previous_attn_implementation)

    def layer_of(self, module: torch.nn.Module) -> BoundLayer:
        """The planned layer ``module`` is bound to.

        Raises:
            KVCacheBindingError: ``module`` is not one of the plan's layers.
        """
        layer = self._layers.get(id(module))
        if layer is None:
            raise KVCacheBindingError(
                f"attention module {type(module).__name__} (layer_idx {getattr(module, 'layer_idx', None)}) "
                "is not a planned layer; plan and bind every attention layer of the model"
            )
        return layer

    def step(self, batch: Sequence[ScheduledRequest]) -> dict[Hashable, torch.Tensor]:
        """Run one engine step: free stale pages, reserve, run the model, return the logits.

        Args:
            batch: one entry per request computed this step. A request that has no pages yet
                must start at ``num_computed=0``; a known one at the tokens it already covers.

        Returns:
            ``{request: logits of its last token this step}`` (``(vocab,)``, float32 as the model
            computes them).

        Raises:
            InvalidInputError: an empty batch, a request twice, a ``num_computed`` that does not
                match the pool, or a model in training mode.
            BlockPoolExhaustedError: the pool cannot hold the step; nothing of this request was
                taken (earlier requests of the batch keep what they reserved).
        """
        if not batch:
            raise InvalidInputError("a step needs at least one scheduled request (got none)")
        if len({r.request_id for r in batch}) != len(batch):
            raise InvalidInputError(f"a request appears twice in one step: {[r.request_id for r in batch]}")
        if self.model.training:
            raise InvalidInputError("the model is in training mode; call model.eval() before decoding")
        slices: list[_Slice] = []
        offset = 0
        encoder_offset = 0
        for request in batch:
            slices.append(self._prepare(request, offset, encoder_offset))
            offset += len(request.token_ids)
            encoder_offset += slices[-1].encoder_tokens
        input_ids = torch.tensor([[t for r in batch for t in r.token_ids]])
        positions = torch.tensor(
            [[r.num_computed + i for r in batch for i in range(len(r.token_ids))]], dtype=torch.long
        )
        context = StepContext(runner=self, index=self.num_steps, slices=tuple(slices))
        device = next(self.model.parameters()).device
        with torch.no_grad():
            if self.encoder_decoder:
                # every request's encoder output, packed like the decoder tokens
                encoded = torch.cat([self._encoded[r.request_id] for r in batch]).unsqueeze(0)
                output = self.model(
                    decoder_input_ids=input_ids.to(device),
                    decoder_position_ids=positions.to(device),
                    encoder_outputs=(encoded,),
                    use_cache=False,
                    **{STEP_KWARG: context},
                )
            else:
                output = self.model(
                    input_ids=input_ids.to(device),
                    position_ids=positions.to(device),
                    use_cache=False,
                    **{STEP_KWARG: context},
                )
        self.num_steps += 1
        logits = output.logits[0]
        return {part.request_id: logits[part.offset + part.num_tokens - 1] for part in slices}

    def finish(self, request_id: Hashable) -> None:
        """Free every page the request holds (it is done, or preempted).

        Raises:
            InvalidInputError: unknown request.
        """
        for group in range(len(self.plan.groups)):
            self._record(request_id, group, self.pool.live_pages(request_id, group), FINISH)
        self.pool.free_request(request_id)
        self._encoded.pop(request_id, None)

    def _prepare(self, request: ScheduledRequest, offset: int, encoder_offset: int = 0) -> _Slice:
        known = request.request_id in self.pool.requests
        have = self.pool.num_tokens(request.request_id) if known else 0
        if request.num_computed != have:
            raise InvalidInputError(
                f"request {request.request_id!r} is scheduled at num_computed={request.num_computed} but "
                f"its block tables cover {have} tokens; schedule it from there"
            )
        if known:
            for group, pages in self.pool.release_stale(request.request_id, request.num_computed).items():
                self._record(request.request_id, group, pages, STALE)
        end = request.num_computed + len(request.token_ids)
        for group, pages in self.pool.reserve(request.request_id, end).items():
            self._record(request.request_id, group, pages, TAKE)
        tables = tuple(
            torch.tensor(self.pool.block_table(request.request_id, group), dtype=torch.long)
            for group in range(len(self.plan.groups))
        )
        encoder_tokens = 0
        if self.encoder_decoder:
            encoded = self._encoded.get(request.request_id)
            if encoded is None:
                raise InvalidInputError(
                    f"request {request.request_id!r} has no encoder output; encode() it before its first step"
                )
            encoder_tokens = int(encoded.shape[0])
        return _Slice(
            request_id=request.request_id,
            offset=offset,
            start=request.num_computed,
            num_tokens=len(request.token_ids),
            tables=tables,
            encoder_offset=encoder_offset,
            encoder_tokens=encoder_tokens,
        )

    def _record(self, request_id: Hashable, group: int, pages: Sequence[int], action: str) -> None:
        self.events.extend(
            PageEvent(step=self.num_steps, request_id=request_id, group=group, page=page, action=action)
            for page in pages
        )
