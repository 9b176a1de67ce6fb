"""State pages go to the host tier as checkpoints and come back: decoding resumes from them
exactly as if the state had never left.

The reference runner attends only, so the state model here is a small recurrent decoder of its
own (two layers, each a short convolution window and a decaying outer-product state, as a
Mamba or gated-delta layer keeps) whose per-request states live in the pages of a ``state``
group kvcore planned and allocated (``cache_mode="all"``: a checkpoint per block). At every
block boundary the running state is copied into that block's checkpoint page. A checkpoint
goes out to a :class:`~kvcore.runtime.host_tier.HostTier`, every device page is poisoned, and
the checkpoint comes back into another page: a request resumed from it (the same request, or
one that shares the prefix, a prefix hit) must produce the tokens of a run from scratch. The
broken twin (the checkpoint not brought back) must not.
"""

from __future__ import annotations

import torch

from kvcore import SizingContext, allocate, plan_kv_cache
from kvcore.planning.offload import with_host_memory
from kvcore.plugins.state import StatePart, StateSpec
from kvcore.runtime.host_tier import HostTier

BLOCK = 4
WIDTH = 8
VOCAB = 64
LAYERS = ("mix.0", "mix.1")


class StateModel:
    """A recurrent decoder whose states are page views: ``conv`` (the last 3 inputs) and ``ssm``
    (a ``WIDTH x WIDTH`` state) per layer, one page per state."""

    def __init__(self, registry) -> None:
        spec = StateSpec(
            block_size=BLOCK,
            parts=(
                StatePart(name="conv", shape=(3, WIDTH), dtype="float32"),
                StatePart(name="ssm", shape=(WIDTH, WIDTH), dtype="float32"),
            ),
            cache_mode="all",
        )
        context = SizingContext(max_model_len=64, max_num_batched_tokens=16)
        plan = plan_kv_cache(dict.fromkeys(LAYERS, spec), 1 << 20, context, registry=registry, num_blocks=48)
        self.plan = with_host_memory(plan, 8 * plan.pools[0].bytes_per_block * plan.groups[0].blocks_per_page)
        self.views = allocate(self.plan, "cpu", registry=registry)
        self.tier = HostTier(self.plan, self.views, registry=registry)
        weights = torch.Generator().manual_seed(3)
        self.embed = torch.randn(VOCAB, WIDTH, generator=weights)
        self.mix = [torch.randn(WIDTH, 4 * WIDTH, generator=weights) / 4 for _ in LAYERS]
        self.out = torch.randn(VOCAB, WIDTH, generator=weights)

    def clear(self, page: int) -> None:
        for name in LAYERS:
            for part in self.views[name]:
                part[page].zero_()

    def copy_page(self, source: int, target: int) -> None:
        for name in LAYERS:
            for part in self.views[name]:
                part[target].copy_(part[source])

    def poison(self) -> None:
        for name in LAYERS:
            for part in self.views[name]:
                part.fill_(float("nan"))

    def feed(self, page: int, token: int) -> torch.Tensor:
        """One token through both layers on the running state in ``page``; the logits."""
        x = self.embed[token]
        for name, weight in zip(LAYERS, self.mix, strict=True):
            conv, ssm = self.views[name].part("conv")[page], self.views[name].part("ssm")[page]
            h = torch.tanh(weight @ torch.cat([conv.flatten(), x]))
            conv.copy_(torch.cat([conv[1:], x[None]]))
            ssm.mul_(0.9).add_(torch.outer(h, h))
            x = ssm @ h / (1 + ssm.norm())
        return self.out @ x

    def run(
        self,
        tokens: list[int],
        new: int,
        *,
        running: int,
        checkpoints: dict[int, int] | None = None,
        start: int = 0,
    ) -> list[int]:
        """Feed ``tokens[start:]`` then decode ``new`` greedy tokens on the running state in page
        ``running`` (already holding the state after ``start`` tokens); at each block boundary
        ``n`` copy it into page ``checkpoints[n]`` if given."""
        seq = list(tokens)
        out: list[int] = []
        logits = None
        for position in range(start, len(seq) + new - 1):
            if position >= len(seq):
                seq.append(out[-1])
            logits = self.feed(running, seq[position])
            if position >= len(tokens) - 1:
                out.append(int(torch.argmax(logits)))
            done = position + 1
            if checkpoints is not None and done % BLOCK == 0 and done in checkpoints:
                self.copy_page(running, checkpoints[done])
        return out


def _prompt(seed: int, length: int) -> list[int]:
    return torch.randint(0, VOCAB, (length,), generator=torch.Generator().manual_seed(seed)).tolist()


def _offloaded_checkpoint(registry):
    """A request's 12 output tokens from a 14-token prompt, then the same prompt's state at 12
    tokens (block 3's boundary) checkpointed in page 5, sent to the host tier and the device
    pages poisoned. Returns the model, the prompt, the tokens and the checkpoint's host slot."""
    model = StateModel(registry)
    prompt = _prompt(1, 14)
    model.clear(0)
    expected = model.run(prompt, 12, running=0)
    model.clear(0)
    model.run(prompt[:12], 1, running=0, checkpoints={12: 5})
    (slot,) = model.tier.offload(0, [5])
    model.poison()
    return model, prompt, expected, slot


def test_the_same_request_resumes_from_a_checkpoint_that_went_out(registry):
    model, prompt, expected, slot = _offloaded_checkpoint(registry)
    model.tier.restore(0, [slot], [7])  # back into another page, as a pool hands out
    assert model.run(prompt, 12, running=7, start=12) == expected


def test_a_prefix_hit_resumes_another_request_from_the_checkpoint(registry):
    model = StateModel(registry)
    shared = _prompt(2, 8)
    first, second = shared + _prompt(3, 5), shared + _prompt(4, 6)
    model.clear(0)
    expected = model.run(second, 10, running=0)
    model.clear(1)
    model.run(first, 4, running=1, checkpoints={4: 2, 8: 3})
    slots = model.tier.offload(0, [2, 3])  # the first request's checkpoints go out
    model.poison()  # and its pages are reused for others
    model.tier.restore(0, slots[1:], [9])  # the second request's 8 shared tokens hit block 2's checkpoint
    assert model.run(second, 10, running=9, start=8) == expected
    model.tier.release(0, slots)


def test_the_check_fails_when_the_checkpoint_does_not_come_back(registry):
    model, prompt, expected, _ = _offloaded_checkpoint(registry)
    model.clear(7)  # a fresh state instead of the checkpoint
    assert model.run(prompt, 12, running=7, start=12) != expected
