"""Tiny random-weight transformers models, transformers' own greedy decoding, and kvcore's.

Every model is built from a config (no download), in float32, with a fixed seed; widths are
tiny (hidden 32, 4 query heads over 2 KV heads of 8) and layer counts 2-4, while the layer
patterns, windows, chunks, softcapping and sinks are the families' own. kvcore plans each model
the way an engine would: :class:`kvcore.LocalExecutor` scans the modules (block size 4),
:func:`kvcore.initialize_kv_caches` plans, allocates and binds, and the reference runner decodes
on the bound views.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from typing import Any

import attrs
import torch

from kvcore import BlockPool, KVCachePlan, LocalExecutor, Registry, SizingContext, initialize_kv_caches
from kvcore.testing.reference import DecodeRequest, Generation, PagedAttentionRunner

#: Tokens per block: small, so that pages of requests and groups interleave within a few tokens.
BLOCK_SIZE = 4
#: Longest request (prompt plus output) and tokens per engine step: prompts longer than 16
#: tokens are prefilled in chunks, beside other requests' decode tokens.
CONTEXT = SizingContext(max_model_len=96, max_num_batched_tokens=16)
#: A budget where everything fits at once (thousands of blocks for these widths).
ROOMY_BYTES = 1 << 21
#: Logits must agree this closely with transformers' (float32).
TOLERANCE = 1e-4
#: Prompt lengths and output lengths of the concurrent requests (finishing at different steps).
PROMPT_LENGTHS = (5, 17, 40, 11)
NEW_TOKENS = (36, 32, 33, 40)

_BASE = {
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 8,
    "vocab_size": 128,
    "pad_token_id": 0,
}


@attrs.frozen(kw_only=True)
class TinyModel:
    """A tiny model of one family and what kvcore must make of it.

    Attributes:
        name: test id.
        config_class: the transformers config class.
        model_class: the transformers causal-LM class.
        config: config fields beyond the shared tiny widths.
        policy: the policy ``auto`` must pick.
        forgets: whether some layers drop tokens (sliding window or chunk), so pages are freed
            while a request decodes.
        base: the shared widths, or ``None`` when ``config`` states every width itself (an
            encoder-decoder model names them its own way).
        encoder_features: for an encoder-decoder model, the shape of one request's encoder input
            (Whisper's log-mel features, ``(1, num_mel_bins, 2 x max_source_positions)``).
    """

    name: str
    config_class: str
    model_class: str
    config: Mapping[str, Any]
    policy: str
    forgets: bool
    base: Mapping[str, Any] | None = _BASE
    encoder_features: tuple[int, ...] | None = None

    def build(self) -> torch.nn.Module:
        """The model with random weights (seed 0), in eval mode."""
        import transformers

        config = getattr(transformers, self.config_class)(**(self.base or {}), **self.config)
        torch.manual_seed(0)
        model: torch.nn.Module = getattr(transformers, self.model_class)(config)
        return model.eval()


MODELS = {
    model.name: model
    for model in (
        TinyModel(
            name="llama",
            config_class="LlamaConfig",
            model_class="LlamaForCausalLM",
            config={"num_hidden_layers": 2},
            policy="uniform",
            forgets=False,
        ),
        # sliding and full attention alternate; attention logits softcapped at 50, final at 30
        TinyModel(
            name="gemma2",
            config_class="Gemma2Config",
            model_class="Gemma2ForCausalLM",
            config={"num_hidden_layers": 4, "sliding_window": 8},
            policy="shared_buffer",
            forgets=True,
        ),
        # three sliding layers to one full (Gemma-3's 5:1, shortened), q/k norms, query_pre_attn_scalar
        TinyModel(
            name="gemma3",
            config_class="Gemma3TextConfig",
            model_class="Gemma3ForCausalLM",
            config={"num_hidden_layers": 4, "sliding_window": 8, "sliding_window_pattern": 4},
            policy="shared_buffer",
            forgets=True,
        ),
        # sliding and full alternate, per-head attention sinks, mixture of experts
        TinyModel(
            name="gpt_oss",
            config_class="GptOssConfig",
            model_class="GptOssForCausalLM",
            config={
                "num_hidden_layers": 4,
                "sliding_window": 8,
                "num_local_experts": 4,
                "num_experts_per_tok": 2,
            },
            policy="shared_buffer",
            forgets=True,
        ),
        # the first max_window_layers layers full, the rest sliding; q/k norms
        TinyModel(
            name="qwen3",
            config_class="Qwen3Config",
            model_class="Qwen3ForCausalLM",
            config={
                "num_hidden_layers": 4,
                "use_sliding_window": True,
                "sliding_window": 16,
                "max_window_layers": 2,
            },
            policy="shared_buffer",
            forgets=True,
        ),
        # chunked local attention on RoPE layers, a full NoPE layer every 4th (the plan gives two of
        # its three groups block size 8, so block tables of two sizes interleave). Temperature tuning
        # is off: transformers derives its NoPE scale from its own cache length, not from the
        # positions it is given, so no external cache can reproduce it.
        TinyModel(
            name="llama4",
            config_class="Llama4TextConfig",
            model_class="Llama4ForCausalLM",
            config={
                "num_hidden_layers": 4,
                "intermediate_size_mlp": 64,
                "attention_chunk_size": 8,
                "num_local_experts": 2,
                "attn_temperature_tuning": False,
            },
            policy="shared_buffer",
            forgets=True,
        ),
        # an encoder-decoder: the decoder's self attention (full) and cross attention over the
        # encoder's 12 audio frames (3 pages of 4, taken at a request's first step, kept to its
        # end); the encoder holds no cache. Each request brings its own random audio features.
        TinyModel(
            name="whisper",
            config_class="WhisperConfig",
            model_class="WhisperForConditionalGeneration",
            config={
                "d_model": 32,
                "encoder_layers": 2,
                "decoder_layers": 2,
                "encoder_attention_heads": 4,
                "decoder_attention_heads": 4,
                "encoder_ffn_dim": 64,
                "decoder_ffn_dim": 64,
                "num_mel_bins": 8,
                "max_source_positions": 12,
                "max_target_positions": 96,
                "vocab_size": 128,
                "pad_token_id": 0,
                "bos_token_id": 1,
                "eos_token_id": 2,
                "decoder_start_token_id": 1,
                "begin_suppress_tokens": None,
                "suppress_tokens": None,
            },
            policy="shared_buffer",
            forgets=False,
            base=None,
            encoder_features=(1, 8, 24),
        ),
    )
}


def requests(
    vocab_size: int = _BASE["vocab_size"], encoder_features: tuple[int, ...] | None = None
) -> list[DecodeRequest]:
    """The concurrent requests: random prompts of :data:`PROMPT_LENGTHS` (fixed seed), and for an
    encoder-decoder model random encoder inputs of ``encoder_features`` each."""
    generator = torch.Generator().manual_seed(1234)
    features = torch.Generator().manual_seed(99)
    return [
        DecodeRequest(
            request_id=f"r{i}",
            prompt=torch.randint(3, vocab_size, (length,), generator=generator).tolist(),
            max_new_tokens=new,
            encoder_inputs=(
                {"input_features": torch.randn(encoder_features, generator=features)}
                if encoder_features is not None
                else None
            ),
        )
        for i, (length, new) in enumerate(zip(PROMPT_LENGTHS, NEW_TOKENS, strict=True))
    ]


@attrs.frozen(kw_only=True, eq=False)
class Reference:
    """transformers' greedy output for one request."""

    tokens: tuple[int, ...]
    logits: torch.Tensor


def reference_generate(model: Any, request: DecodeRequest) -> Reference:
    """transformers' own ``generate()``: greedy, eager attention and transformers' cache, no stop token.

    For an encoder-decoder model the prompt is the decoder's (``decoder_input_ids``) and the
    request's encoder inputs go to the encoder; the generic ``GenerationMixin.generate`` runs
    (Whisper's own adds language and timestamp logic, which is not the cache's business).
    """
    import transformers

    model.set_attn_implementation("eager")
    ids = torch.tensor([request.prompt])
    if request.encoder_inputs is not None:
        inputs: dict[str, Any] = {**request.encoder_inputs, "decoder_input_ids": ids}
        generate = functools.partial(transformers.GenerationMixin.generate, model)
    else:
        inputs = {"inputs": ids, "attention_mask": torch.ones_like(ids)}
        generate = model.generate
    out = generate(
        **inputs,
        max_new_tokens=request.max_new_tokens,
        do_sample=False,
        eos_token_id=None,
        pad_token_id=0,
        output_logits=True,
        return_dict_in_generate=True,
    )
    tokens = tuple(out.sequences[0, len(request.prompt) :].tolist())
    assert len(tokens) == request.max_new_tokens
    return Reference(tokens=tokens, logits=torch.stack(out.logits)[:, 0].float())


def kvcore_runner(
    model: torch.nn.Module,
    registry: Registry,
    *,
    num_blocks: int | None = None,
    pool_factory: Callable[[KVCachePlan], BlockPool] = BlockPool,
    runner_class: type[PagedAttentionRunner] = PagedAttentionRunner,
    plan: KVCachePlan | None = None,
    context: SizingContext = CONTEXT,
    policy: str = "auto",
) -> PagedAttentionRunner:
    """Scan, plan with ``policy`` (or take ``plan``), allocate on the CPU and bind, then wrap in
    a runner."""
    executor = LocalExecutor(
        model, "cpu", registry=registry, scan_options={"block_size": BLOCK_SIZE}, kv_cache_bytes=ROOMY_BYTES
    )
    if plan is None:
        initialize_kv_caches(
            executor, registry=registry, policy=policy, context=context, num_blocks=num_blocks
        )
    else:
        executor.get_kv_cache_spec()
        executor.initialize(plan)
    assert executor.plan is not None
    return runner_class.from_executor(executor, pool=pool_factory(executor.plan))


def mismatches(ours: Mapping[Any, Generation], reference: Mapping[Any, Reference]) -> list[str]:
    """Every request whose tokens differ from transformers', or whose logits differ by more than
    :data:`TOLERANCE`."""
    problems = []
    for request_id, expected in reference.items():
        got = ours[request_id]
        if got.tokens != expected.tokens:
            first = next(
                i for i, (a, b) in enumerate(zip(got.tokens, expected.tokens, strict=True)) if a != b
            )
            said = expected.tokens[first]
            problems.append(f"{request_id}: token {first} is {got.tokens[first]}, transformers says {said}")
        gap = float((got.logits - expected.logits).abs().max())
        if gap > TOLERANCE:
            problems.append(f"{request_id}: logits differ by up to {gap:.3g}")
    return problems


def block_holders(runner: PagedAttentionRunner) -> dict[int, list[tuple[Any, int]]]:
    """``{block id: [(request, group), ...]}``: who took each block id, in order, over the run."""
    holders: dict[int, list[tuple[Any, int]]] = {}
    for event in runner.events:
        if event.action == "take":
            for block in runner.pool.blocks_of(event.group, event.page):
                holders.setdefault(block, []).append((event.request_id, event.group))
    return holders


def shared_groups(plan: KVCachePlan) -> list[set[int]]:
    """For each plan tensor, the groups of the layers that view it."""
    index = {name: g for g, group in enumerate(plan.groups) for name in group.layer_names}
    return [{index[name] for name in tensor.shared_by} for tensor in plan.tensors]


def tight_num_blocks(
    runner: PagedAttentionRunner, requests: list[DecodeRequest] | tuple[DecodeRequest, ...]
) -> int:
    """Room for the two largest requests at their worst (per group, from the pool), never for all."""
    groups = range(len(runner.plan.groups))
    needs = sorted(
        sum(runner.pool.blocks_needed(g, len(r.prompt) + r.max_new_tokens) for g in groups) for r in requests
    )
    assert needs[-1] + needs[-2] < sum(needs)
    return needs[-1] + needs[-2]
