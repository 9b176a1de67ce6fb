"""Errors carry their figures and speak Python; the command line words them with its flags."""

import ast
import inspect
import pathlib
import re

import pytest
import torch

import kvcore.errors
from kvcore import (
    DeviceUnavailableError,
    InsufficientMemoryError,
    KVCacheAllocationError,
    KVCoreError,
    SizingContext,
    plan_kv_cache,
)
from kvcore.cli.inputs import FLAG_NAMES
from kvcore.error_messages import PYTHON_NAMES, render, with_message
from kvcore.planning.planner import check_forced_blocks
from kvcore.planning.ranks import plan_for_ranks
from kvcore.runtime.allocation import allocate_buffers
from kvcore.runtime.memory import device_memory
from tests.helpers import full

MiB = 2**20
GiB = 2**30
SPEC = full(block_size=16, heads=2, head_size=64, dtype="float32")  # 16 KiB per block
P = SPEC.page_size_bytes
LLAMA_8B = {f"l{i}": full() for i in range(32)}  # 2 MiB per block of 16 tokens, as Llama-3.1-8B
CORE = pathlib.Path(kvcore.errors.__file__).parent


def speaks_python(text):
    """No command-line flag in ``text``; fails with the flag it found."""
    flags = re.findall(r"--[a-z][a-z-]*", text)
    assert not flags, f"{flags} in {text!r}"


def test_one_request_over_the_memory(registry):
    with pytest.raises(InsufficientMemoryError) as info:
        plan_kv_cache(LLAMA_8B, GiB, SizingContext(max_model_len=131072), registry=registry)
    err = info.value
    assert err.reason == "memory" and err.where == ""
    assert (err.required_bytes, err.available_bytes, err.bytes_per_block) == (16 * GiB, GiB, 2 * MiB)
    assert (err.required_blocks, err.available_blocks) == (8192, 512)
    assert (err.max_model_len, err.largest_fitting_len) == (131072, 8192)
    common = (
        "one request of 131072 tokens needs 16.00 GiB of KV cache (8192 blocks of 2.00 MiB) but only "
        "1.00 GiB is available (512 blocks of 2.00 MiB); the largest max_model_len that fits is 8192; "
    )
    speaks_python(str(err))
    assert str(err) == common + (
        "lower max_model_len to 8192 or give the KV cache more memory "
        "(available_bytes/kv_cache_bytes, or a higher utilization)"
    )
    assert render(err, FLAG_NAMES) == common + (
        "lower --max-model-len to 8192 or give the KV cache more memory (--memory, or a higher utilization)"
    )


def test_one_request_over_a_forced_block_count(registry):
    with pytest.raises(InsufficientMemoryError) as info:
        plan_kv_cache(
            {"l1": SPEC}, P * 100, SizingContext(max_model_len=512), registry=registry, num_blocks=16
        )
    err = info.value
    assert err.reason == "num_blocks"
    assert (err.required_blocks, err.available_blocks, err.largest_fitting_len) == (32, 16, 256)
    assert (err.required_bytes, err.available_bytes) == (32 * P, 16 * P)
    speaks_python(str(err))
    assert "but num_blocks=16 holds 256.00 KiB;" in str(err)
    assert "lower max_model_len to 256 or raise num_blocks to at least 32" in str(err)
    cli = render(err, FLAG_NAMES)
    assert "but --num-blocks 16 holds 256.00 KiB;" in cli
    assert "lower --max-model-len to 256 or raise --num-blocks to at least 32" in cli


def test_a_forced_block_count_over_the_memory():
    with pytest.raises(InsufficientMemoryError) as info:
        check_forced_blocks(11, P, 10 * P, SizingContext(max_model_len=16))
    err = info.value
    assert err.reason == "forced_num_blocks"
    assert (err.required_blocks, err.available_blocks, err.bytes_per_block) == (11, 10, P)
    assert (err.required_bytes, err.available_bytes, err.max_model_len) == (11 * P, 10 * P, 16)
    speaks_python(str(err))
    assert str(err) == (
        "num_blocks=11 needs 176.00 KiB (11 blocks of 16.00 KiB) but only 160.00 KiB is available; "
        "at most 10 blocks fit: lower num_blocks or give the KV cache more memory "
        "(available_bytes/kv_cache_bytes, or a higher utilization)"
    )
    assert render(err, FLAG_NAMES) == (
        "--num-blocks 11 needs 176.00 KiB (11 blocks of 16.00 KiB) but only 160.00 KiB is available; "
        "at most 10 blocks fit: lower --num-blocks or give the KV cache more memory "
        "(--memory, or a higher utilization)"
    )


def test_not_even_one_token(registry):
    with pytest.raises(InsufficientMemoryError) as info:
        plan_kv_cache({"l": full()}, 100, SizingContext(max_model_len=16), registry=registry)
    err = info.value
    assert err.largest_fitting_len == 0 and err.available_blocks == 0
    speaks_python(str(err))
    assert str(err).endswith(
        "not even a one-token request fits; give the KV cache more memory "
        "(available_bytes/kv_cache_bytes, or a higher utilization)"
    )
    assert render(err, FLAG_NAMES).endswith("(--memory, or a higher utilization)")


def test_errors_of_one_rank_name_it_in_both_wordings(registry):
    ranks = [{"a": full()}, {"a": full()}, {"b": full()}, {"b": full()}]
    memory = [GiB, GiB, 100 * full().page_size_bytes, GiB]
    with pytest.raises(InsufficientMemoryError) as info:
        plan_for_ranks(
            ranks, memory, SizingContext(max_model_len=1024), registry=registry, num_blocks=500, tp_size=2
        )
    err = info.value
    assert err.where == "rank 2 (pp stage 1, tp rank 0)" and err.required_blocks == 500
    speaks_python(str(err))
    assert str(err).startswith("rank 2 (pp stage 1, tp rank 0): num_blocks=500 needs")
    assert render(err, FLAG_NAMES).startswith("rank 2 (pp stage 1, tp rank 0): --num-blocks 500 needs")


def test_on_rank_keeps_every_figure():
    with pytest.raises(InsufficientMemoryError) as info:
        check_forced_blocks(11, P, 10 * P, SizingContext(max_model_len=16))
    err = info.value
    ranked = err.on_rank("rank 1 (pp stage 0, tp rank 1) has the fewest blocks")
    for name in ("reason", "required_bytes", "available_bytes", "max_model_len", "largest_fitting_len"):
        assert getattr(ranked, name) == getattr(err, name)
    assert str(ranked) == f"rank 1 (pp stage 0, tp rank 1) has the fewest blocks: {err}"
    assert str(ranked) == render(ranked)


def _fail_second(nbytes, device):
    if _fail_second.calls:
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 MiB")
    _fail_second.calls += 1
    return torch.empty(nbytes, dtype=torch.uint8, device=device)


def test_a_failed_allocation(monkeypatch):
    monkeypatch.setattr(_fail_second, "calls", 0, raising=False)
    with pytest.raises(KVCacheAllocationError) as info:
        allocate_buffers([MiB, 2 * MiB, MiB], torch.device("cpu"), allocator=_fail_second)
    err = info.value
    assert (err.requested_bytes, err.allocated_bytes, err.num_allocations) == (4 * MiB, MiB, 3)
    assert err.device == "cpu" and err.free_bytes is not None
    assert err.failure == "OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 MiB"
    speaks_python(str(err))
    start = "allocating the KV cache on cpu failed after 1.00 MiB of 4.00 MiB in 3 allocation(s) ("
    assert str(err).startswith(start) and render(err, FLAG_NAMES).startswith(start)
    assert str(err).endswith("plan for less memory (a lower utilization or available_bytes/kv_cache_bytes)")
    assert render(err, FLAG_NAMES).endswith("plan for less memory (a lower utilization or --memory)")


def test_a_device_kvcore_cannot_measure():
    with pytest.raises(DeviceUnavailableError) as info:
        device_memory("meta")
    assert info.value.device == "meta"
    speaks_python(str(info.value))
    assert "give the KV cache a fixed size instead (kv_cache_bytes=...)" in str(info.value)


def test_errors_without_figures_keep_their_own_message():
    own = InsufficientMemoryError(
        "request 'a' needs 9 blocks",
        required_bytes=9,
        available_bytes=8,
        max_model_len=9,
        largest_fitting_len=8,
    )
    assert own.reason is None
    assert render(own, FLAG_NAMES) == render(own) == str(with_message(own)) == "request 'a' needs 9 blocks"
    checked = KVCacheAllocationError("bad tensor", requested_bytes=1, allocated_bytes=0, free_bytes=None)
    assert render(checked, FLAG_NAMES) == "bad tensor"


def test_python_names_are_the_parameters_of_the_entry_points():
    from kvcore.engine.local import LocalExecutor
    from kvcore.engine.workflow import initialize_kv_caches

    parameters = {
        *inspect.signature(plan_kv_cache).parameters,
        *inspect.signature(initialize_kv_caches).parameters,
        *inspect.signature(LocalExecutor).parameters,
        *inspect.signature(SizingContext).parameters,
    }
    names = [PYTHON_NAMES.max_model_len, PYTHON_NAMES.num_blocks, PYTHON_NAMES.utilization]
    names += PYTHON_NAMES.memory.split("/")
    assert set(names) <= parameters


def test_every_error_is_a_kvcore_error():
    classes = [
        obj
        for obj in vars(kvcore.errors).values()
        if isinstance(obj, type) and issubclass(obj, Exception) and not issubclass(obj, Warning)
    ]
    assert len(classes) > 15
    assert all(issubclass(cls, KVCoreError) for cls in classes)
    # the one warning (a skipped plugin) is a UserWarning, shown by default
    assert issubclass(kvcore.errors.PluginFailedWarning, UserWarning)


def _literals(tree):
    """String constants of ``tree`` that are not docstrings."""
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
            yield node


def _core_modules():
    """Every module but the command line's, built-in plugins and policies included."""
    paths = set(CORE.rglob("*.py"))
    return sorted(p for p in paths if p.relative_to(CORE).parts[0] != "cli")


def _engine_flags(path):
    """An engine integration's messages may name the engine's own server flags (SGLang's
    ``--max-total-tokens``): its users set those on the engine's command line, not kvcore's.
    That is every module of ``integrations/<engine>/``."""
    parts = path.relative_to(CORE).parts
    return parts[0] == "integrations" and len(parts) > 2


#: Modules whose strings are engines' flags as data, not messages: the flags-out table of a
#: tuned candidate (``--max-num-seqs`` there is vLLM's flag, whatever kvcore's own are called).
ENGINE_FLAG_TABLES = ("integrations/tuned.py",)


@pytest.mark.parametrize("path", _core_modules(), ids=lambda p: str(p.relative_to(CORE)))
def test_no_message_outside_the_command_line_names_a_flag(path):
    from kvcore.cli import build_parser

    if path.relative_to(CORE).as_posix() in ENGINE_FLAG_TABLES:
        pytest.skip("its strings are the engines' flags for a tuned candidate")

    parser = build_parser()
    kvcore_flags = set(parser._option_string_actions)
    for action in parser._subparsers._group_actions if parser._subparsers else ():
        for sub in action.choices.values():
            kvcore_flags |= set(sub._option_string_actions)
    for node in _literals(ast.parse(path.read_text())):
        flags = re.findall(r"(?<![\w-])--[a-z][a-z-]*", node.value)
        if _engine_flags(path):
            flags = [flag for flag in flags if flag in kvcore_flags]
        assert not flags, f"{path.name}:{node.lineno} names {flags}; say the Python parameter instead"
