"""vLLM's per-device max_num_seqs / max_num_batched_tokens defaults, as vLLM's
``EngineArgs.get_batch_defaults`` sets them for ``vllm serve``."""

import pytest

from kvcore.simulation.gpus import find_gpu
from kvcore.simulation.profiles.vllm_batch_defaults import serve_defaults


@pytest.mark.parametrize(
    ("gpu", "seqs", "tokens"),
    [
        (None, 128, 2048),  # CPU
        ("L40S", 256, 2048),  # under 70 GiB
        ("A100-80GB", 256, 2048),  # 80 GiB, but an A100: vLLM keeps it on the small defaults
        ("H100", 1024, 8192),
        ("H200", 1024, 8192),
        ("B200", 1024, 16384),  # 160 GiB or more
    ],
)
def test_each_device_gets_vllms_own_defaults(gpu, seqs, tokens):
    got = serve_defaults(find_gpu(gpu) if gpu else None)
    assert (got.max_num_seqs, got.max_num_batched_tokens) == (seqs, tokens)
    assert "EngineArgs.get_batch_defaults" in got.line()


def test_a_cpu_scales_with_its_ranks():
    got = serve_defaults(None, world_size=2)
    assert (got.max_num_seqs, got.max_num_batched_tokens, got.device) == (256, 4096, "CPU x 2 ranks")
