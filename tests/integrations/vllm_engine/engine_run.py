"""One run of vLLM's real engine (the CPU build) on a tiny model, in a process of its own.

``python -m tests.integrations.vllm_engine.engine_run '<json>'`` starts vLLM's ``LLM`` (the
engine core in-process, ``VLLM_ENABLE_V1_MULTIPROCESSING=0``, so that its scheduler can be read)
with kvcore's plugin on (``policy`` set: ``KVCORE_VLLM_POLICY``) or off, then:

1. generates greedily from a few prompts (token ids) and records the tokens;
2. with the plugin on, plans again with kvcore (:func:`~kvcore.integrations.vllm.plugin.kvcore_plans`)
   from the engine's own layer specs and budget, and records that plan beside the config the
   engine runs;
3. with ``admission`` set, starts that many requests of ``max_model_len`` tokens more than
   kvcore promises at once, steps the engine and records the most requests running at once and
   the preemptions (by wrapping the scheduler's ``schedule``);
4. with ``trace`` set (requests of ``prompt_tokens``, ``output_tokens`` and ``arrival_step``,
   and optionally ``prefix_id`` and ``prefix_tokens``: a shared prefix's first tokens), adds each
   request before the engine step of that number, steps the engine until every request has
   finished, and records the steps, the requests running after each step's ``schedule()`` and
   the preemptions.

The result is one JSON line on stdout, after ``RESULT_MARK``. One process per plugin setting,
since the plugin reads its settings when vLLM loads it.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

RESULT_MARK = "KVCORE-ENGINE-RESULT "


def config_summary(config: Any) -> dict[str, Any]:
    """What a ``KVCacheConfig`` lays out: blocks, groups (layers, spec class, block size, page
    bytes) and tensors (bytes, layers in order, strides, offset)."""
    return {
        "num_blocks": config.num_blocks,
        "groups": [
            {
                "layers": sorted(group.layer_names),
                "spec": type(group.kv_cache_spec).__name__,
                "block_size": group.kv_cache_spec.block_size,
                "page_bytes": group.kv_cache_spec.page_size_bytes,
            }
            for group in config.kv_cache_groups
        ],
        "tensors": sorted(
            [t.size, list(t.layers), t.layer_stride, t.block_stride, t.offset]
            for t in config.kv_cache_tensors
        ),
    }


#: The tiny models' vocabulary (tests/integrations/vllm_engine/tiny_models.py).
VOCAB = 512


def _prompts(count: int, length: int, vocab: int = VOCAB) -> list[list[int]]:
    return [[(7 * i + 13 * j) % (vocab - 2) + 1 for j in range(length)] for i in range(count)]


def first_prompt(length: int = 100) -> list[int]:
    """The first prompt of a run's greedy generation (``prompt_tokens`` long)."""
    return _prompts(1, length)[0]


def main(settings: dict[str, Any]) -> dict[str, Any]:
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    if settings.get("policy"):
        os.environ["KVCORE_VLLM_POLICY"] = settings["policy"]
    else:
        os.environ.pop("KVCORE_VLLM_POLICY", None)
    from vllm import LLM, SamplingParams

    max_model_len = settings["max_model_len"]
    engine_args: dict[str, Any] = dict(
        model=settings["model"],
        skip_tokenizer_init=True,
        max_model_len=max_model_len,
        enforce_eager=True,
        seed=0,
        dtype="bfloat16",
        max_num_seqs=settings.get("max_num_seqs", 64),
        enable_prefix_caching=settings.get("prefix_caching", False),
        # on CPU this is the share of the machine's memory vLLM reserves (its CPU worker checks
        # it is free at start-up); a tiny model needs little
        gpu_memory_utilization=settings.get("memory_share", 0.1),
    )
    if settings.get("block_size"):
        engine_args["block_size"] = settings["block_size"]
    if settings.get("max_num_batched_tokens"):
        engine_args["max_num_batched_tokens"] = settings["max_num_batched_tokens"]
    if settings.get("num_blocks"):
        engine_args["num_gpu_blocks_override"] = settings["num_blocks"]
    llm = LLM(**engine_args)
    core = llm.llm_engine.engine_core.engine_core
    scheduler = core.scheduler
    vocab = llm.llm_engine.model_config.get_vocab_size()
    result: dict[str, Any] = {"config": config_summary(scheduler.kv_cache_config)}

    greedy = SamplingParams(temperature=0.0, max_tokens=settings.get("output_tokens", 12), ignore_eos=True)
    prompts = [{"prompt_token_ids": p} for p in _prompts(4, settings.get("prompt_tokens", 40), vocab)]
    result["tokens"] = [list(out.outputs[0].token_ids) for out in llm.generate(prompts, greedy)]

    if settings.get("policy"):
        from kvcore.integrations.vllm.admission import promised
        from kvcore.integrations.vllm.convert import plan_to_vllm_config
        from kvcore.integrations.vllm.plugin import kvcore_plans

        specs = core.model_executor.get_kv_cache_specs()
        memory = [core.available_gpu_memory_for_kv_cache] * len(specs)
        plan = kvcore_plans(llm.llm_engine.vllm_config, specs, memory, settings["policy"])[0]
        result["plan"] = config_summary(plan_to_vllm_config(plan, names={}))
        result["plan_groups"] = len(plan.groups)
        result["promise"] = promised(plan)

    count = settings.get("admission", 0) + result.get("promise", 0)
    if settings.get("admission"):
        running, preempted = _count_schedules(scheduler)
        prompt = max_model_len - 1  # one sampled token brings each to max_model_len
        long = SamplingParams(temperature=0.0, max_tokens=max_model_len - prompt, ignore_eos=True)
        engine = llm.llm_engine
        for i, tokens in enumerate(_prompts(count, prompt, vocab)):
            engine.add_request(f"admit-{i}", {"prompt_token_ids": tokens}, long)
        steps = 0
        while engine.has_unfinished_requests() and steps < 10_000:
            engine.step()
            steps += 1
        result["most_running"] = max(running, default=0)
        result["preemptions"] = sum(preempted)
        # the first step that preempted, and how many ran then
        first = next((k for k, n in enumerate(preempted) if n), None)
        result["running_when_first_preempted"] = None if first is None else running[first] + preempted[first]
    if settings.get("trace"):
        result["replay"] = _replay(llm, settings["trace"], vocab)
    return result


def _count_schedules(scheduler: Any) -> tuple[list[int], list[int]]:
    """Wrap ``scheduler.schedule`` so that each call appends the running requests after it and
    the requests it preempted; returns the two lists it fills."""
    running: list[int] = []
    preempted: list[int] = []
    schedule = scheduler.schedule

    def counted_schedule(*args: Any, **kwargs: Any) -> Any:
        output = schedule(*args, **kwargs)
        running.append(len(scheduler.running))
        preempted.append(len(output.preempted_req_ids or ()))
        return output

    scheduler.schedule = counted_schedule
    return running, preempted


def _replay(llm: Any, trace: list[dict[str, int]], vocab: int) -> dict[str, Any]:
    """``trace``'s requests into the engine by step number (``arrival_step``: added before that
    step), stepped to the end: steps, running requests after each ``schedule()``, preemptions."""
    from vllm import SamplingParams

    engine = llm.llm_engine
    scheduler = engine.engine_core.engine_core.scheduler
    running, preempted = _count_schedules(scheduler)
    pending = sorted(range(len(trace)), key=lambda k: trace[k]["arrival_step"])
    step = 0
    while (pending or engine.has_unfinished_requests()) and step < 100_000:
        while pending and trace[pending[0]]["arrival_step"] <= step:
            k = pending.pop(0)
            # each request's own tokens (no two share a block, so no prefix is cached), after its
            # shared prefix's where it has one (the same for every request of the prefix)
            tokens = [(31 * k + 7 * j) % (vocab - 2) + 1 for j in range(trace[k]["prompt_tokens"])]
            shared = trace[k].get("prefix_tokens", 0)
            prefix = trace[k].get("prefix_id", 0)
            tokens[:shared] = [(11 * prefix + 3 * j + 5) % (vocab - 2) + 1 for j in range(shared)]
            params = SamplingParams(temperature=0.0, max_tokens=trace[k]["output_tokens"], ignore_eos=True)
            engine.add_request(f"trace-{k}", {"prompt_token_ids": tokens}, params)
        engine.step()
        step += 1
    del scheduler.schedule
    return {"steps": step, "running": running, "preemptions": sum(preempted)}


if __name__ == "__main__":
    out = main(json.loads(sys.argv[1]))
    print(RESULT_MARK + json.dumps(out), flush=True)
