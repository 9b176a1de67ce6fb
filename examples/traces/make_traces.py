"""Write the example traces of this folder: synthetic draws whose length mixes follow published
chat and long-document workloads (README.md says which figures, and where they come from).

Run from the repository root; the output is the same on every machine (seeded ``random``)::

    python examples/traces/make_traces.py

Each trace is JSON lines, one request a line: ``prompt_tokens``, ``output_tokens`` and
``arrival_step`` (Poisson arrivals at a fixed rate per scheduler step).
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import NamedTuple

from kvcore.simulation.workload import LengthDist

HERE = Path(__file__).parent


class Lengths(NamedTuple):
    """A length distribution, its draws clipped to ``low .. high`` tokens."""

    dist: LengthDist
    low: int
    high: int

    def sample(self, rng: random.Random, count: int) -> list[int]:
        return [max(n, self.low) for n in self.dist.sample(rng, count, self.high)]


def draw(*, count: int, prompt: Lengths, output: Lengths, rate: float, seed: int) -> list[dict[str, int]]:
    """``count`` requests: prompt and output lengths drawn (in that order, from one seeded
    generator), arrivals a Poisson process of ``rate`` requests per step."""
    rng = random.Random(seed)
    prompts = prompt.sample(rng, count)
    outputs = output.sample(rng, count)
    now, out = 0.0, []
    for p, o in zip(prompts, outputs, strict=True):
        now += rng.expovariate(rate)
        out.append({"prompt_tokens": p, "output_tokens": o, "arrival_step": int(now)})
    return out


def with_system_prompts(
    requests: list[dict[str, int]], *, count: int, tokens: tuple[int, int], seed: int
) -> list[dict[str, int | str]]:
    """``requests``, each prompt led by one of ``count`` system prompts (lengths uniform in
    ``tokens``), the prompt used by the ``i``-th most requests ``1/i`` as often as the most used
    (a Zipf law of exponent 1: a few applications take most traffic, a long tail the rest)."""
    rng = random.Random(seed)
    lengths = [rng.randint(*tokens) for _ in range(count)]
    weights = [1 / (i + 1) for i in range(count)]
    out: list[dict[str, int | str]] = []
    for r in requests:
        i = rng.choices(range(count), weights)[0]
        out.append(
            {
                "prompt_tokens": lengths[i] + r["prompt_tokens"],
                "output_tokens": r["output_tokens"],
                "arrival_step": r["arrival_step"],
                "prefix_id": f"system-{i}",
                "prefix_tokens": lengths[i],
            }
        )
    return out


def write(name: str, requests: list[dict[str, int]] | list[dict[str, int | str]]) -> None:
    path = HERE / name
    path.write_text("".join(json.dumps(r) + "\n" for r in requests), encoding="utf-8")
    n = len(requests)
    mean_p = sum(int(r["prompt_tokens"]) for r in requests) / n
    mean_o = sum(int(r["output_tokens"]) for r in requests) / n
    print(f"examples/traces/{name}: {n} requests, prompt mean {mean_p:.0f}, output mean {mean_o:.0f}")


def main() -> None:
    # Chat (ShareGPT as the vLLM paper tokenised it: mean prompt 161, mean output 338 tokens,
    # long-tailed), pruned the way vLLM's serving benchmark prunes ShareGPT: prompt <= 1,024 and
    # prompt + output <= 2,048 tokens, both >= 4.
    chat = draw(
        count=1000,
        prompt=Lengths(LengthDist("lognormal", 161, 1.0), 4, 1024),
        output=Lengths(LengthDist("lognormal", 338, 0.9), 4, 1024),
        rate=2.0,
        seed=14,
    )
    write("chat.jsonl", chat)
    # The first 300 chat turns behind the system prompts of 64 applications (1,000 to 3,000 tokens
    # each, Zipf popularity): an assumed mix, for prefix caching and host-tier sizing.
    system = with_system_prompts(chat[:300], count=64, tokens=(1000, 3000), seed=15)
    write("chat-system-prompts.jsonl", system)
    # Long documents (LongBench summarisation: GovReport 8,169 and QMSum 10,546 words on average,
    # about 1.3 tokens a word; answers of at most 512 tokens, LongBench's limit for these tasks).
    write(
        "long-documents.jsonl",
        draw(
            count=200,
            prompt=Lengths(LengthDist("lognormal", 12000, 0.4), 2048, 30000),
            output=Lengths(LengthDist("lognormal", 300, 0.5), 16, 512),
            rate=0.05,
            seed=14,
        ),
    )


if __name__ == "__main__":
    main()
