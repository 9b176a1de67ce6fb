"""SGLang's own ``KVCacheConfigurator`` for a bundled model, built on CPU as its model runner does.

``ModelRunner.init_kv_cache_configurator`` (``sglang/srt/model_executor/model_runner.py``) builds
it from the published server arguments, the ``ModelConfig`` and the layer split
(``get_hybrid_layer_ids``); the tests build the same from a bundled ``config.json``, without
weights, a device or process groups (``model``, ``pp_group`` and the pools are not read while
pools are sized). The ``quantization_config`` is dropped: SGLang's checks refuse weight formats
(mxfp4, fp8 blocks) a CPU build cannot run, and weights do not change the KV cache.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from sglang.srt.configs.model_config import ModelConfig, get_hybrid_layer_ids, is_hybrid_swa_model
from sglang.srt.mem_cache.kv_cache_configurator import KVCacheConfigurator
from sglang.srt.model_executor.model_runner_components.layer_setup import ModelLayerInfo
from sglang.srt.runtime_context import publish
from sglang.srt.server_args import ServerArgs
from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

from kvcore.frontends.hf_config import load_model_config

#: The configurator's arguments that no model here changes: one bfloat16 model on one CPU worker
#: (no data or pipeline parallelism, no speculative decoding), its pools not built yet.
ONE_CPU_WORKER: dict[str, object] = dict(
    device="cpu", gpu_id=0, attn_dp_size=1, pp_size=1, pp_group=None, model=None, model_dtype=torch.bfloat16,
    spec_algorithm=SpeculativeAlgorithm.NONE, is_draft_worker=False, post_capture_kv_active=False,
    spec_aux_config=None, is_hybrid_swa_compress=False, forward_stream=None, req_to_token_pool=None,
    token_to_kv_pool_allocator=None, memory_pool_config=None,
)  # fmt: skip


def kv_cache_configurator(
    model: str,
    folder: Path,
    *,
    page_size: int,
    kv_cache_dtype: torch.dtype = torch.bfloat16,
    config_changes: dict[str, object] | None = None,
    **server_args: object,
) -> KVCacheConfigurator:
    """SGLang's ``KVCacheConfigurator`` for the bundled ``model`` (or a config file's path),
    its server arguments published.

    Args:
        model: a bundled model's name or a ``config.json`` path.
        folder: an empty folder the model's ``config.json`` is written to.
        page_size: SGLang's ``--page-size``.
        kv_cache_dtype: the cache dtype SGLang resolved (bfloat16, its ``auto`` for these
            models, or ``torch.float8_e4m3fn`` for ``--kv-cache-dtype fp8_e4m3``).
        config_changes: fields to set in the ``config.json`` written (a variant of the model).
        server_args: further ``ServerArgs`` (a Mamba hybrid on CPU needs
            ``mamba_radix_cache_strategy="no_buffer"`` and ``disable_overlap_schedule=True``:
            SGLang's extra buffer needs a GPU).
    """
    config, _ = load_model_config(model)
    config = {k: v for k, v in config.items() if k != "quantization_config" and not k.startswith("_")}
    config |= config_changes or {}
    (folder / "config.json").write_text(json.dumps(config))
    args = ServerArgs(
        model_path=str(folder), device="cpu", skip_tokenizer_init=True, page_size=page_size, **server_args
    )
    publish(args, role="scheduler")
    model_config = ModelConfig.from_server_args(args)
    architectures = model_config.hf_config.architectures
    hybrid = (
        is_hybrid_swa_model(architectures, model_config.hf_text_config) and not args.disable_hybrid_swa_memory
    )
    swa_ids, full_ids = (
        get_hybrid_layer_ids(architectures, model_config.hf_text_config) if hybrid else (None, None)
    )
    layers = model_config.num_hidden_layers
    return KVCacheConfigurator(
        model_config=model_config,
        server_args=args,
        kv_cache_dtype=kv_cache_dtype,
        kv_cache_dtype_str="auto" if kv_cache_dtype == torch.bfloat16 else "fp8_e4m3",
        page_size=page_size,
        sliding_window_size=model_config.sliding_window_size if hybrid else None,
        is_hybrid_swa=hybrid,
        use_mla_backend=model_config.attention_arch.name == "MLA",
        layer_info=ModelLayerInfo(
            start_layer=0,
            end_layer=layers,
            num_effective_layers=layers,
            swa_attention_layer_ids=swa_ids,
            full_attention_layer_ids=full_ids,
        ),
        **ONE_CPU_WORKER,
    )
