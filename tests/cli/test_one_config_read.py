"""A command reads ``--model``'s config once, however many of its parts need it (the specs, the
length, ``--gpu-memory``'s weights, ``--gpu``'s roofline, the SGLang comparison)."""

import pytest

from kvcore.frontends.hf_config import BundledModel

LLAMA = "meta-llama/Llama-3.1-8B"
GEMMA = "google/gemma-3-27b-it"
SYNTHETIC = ("--requests", "4", "--prompt-len", "64", "--output-len", "8")


@pytest.fixture
def reads(monkeypatch):
    """How many times a bundled config was read, by name."""
    counts: dict[str, int] = {}
    original = BundledModel.config

    def counting(self):
        counts[self.name] = counts.get(self.name, 0) + 1
        return original(self)

    monkeypatch.setattr(BundledModel, "config", counting)
    return counts


@pytest.mark.parametrize(
    "argv",
    [
        ("plan", "--model", LLAMA, "--gpu-memory", "80GiB", "--max-model-len", "auto"),
        ("plan", "--model", LLAMA, "--gpu-memory", "80GiB", "--tp", "2", "--pp", "2"),
        (
            "compare",
            "--model",
            GEMMA,
            "--gpu-memory",
            "80GiB",
            "--max-model-len",
            "8192",
            "--engine",
            "sglang",
        ),
        (
            "simulate",
            "--model",
            LLAMA,
            "--memory",
            "4GiB",
            "--max-model-len",
            "4096",
            *SYNTHETIC,
            "--gpu",
            "h100",
        ),
        ("models", GEMMA),
    ],
    ids=["plan-gpu-memory", "plan-ranks", "compare-sglang", "simulate-gpu", "models"],
)
def test_the_model_config_is_read_once_per_command(run_cli, reads, argv):
    status, _, err = run_cli(*argv)
    assert status == 0, err
    assert reads == {argv[2] if argv[0] != "models" else argv[1]: 1}
