"""Fixtures: each tiny model built once, with transformers' own greedy outputs for the requests."""

from __future__ import annotations

import attrs
import pytest
import torch

from kvcore.testing.reference import DecodeRequest
from tests.engine.decode._tiny import MODELS, Reference, TinyModel, reference_generate, requests


@attrs.frozen(kw_only=True, eq=False)
class Subject:
    """A built tiny model, the requests, and transformers' answers to them."""

    tiny: TinyModel
    model: torch.nn.Module
    requests: tuple[DecodeRequest, ...]
    reference: dict[str, Reference]


@pytest.fixture(scope="package", autouse=True)
def one_thread():
    """One intra-op thread while these tests run: the models are tiny, so a second thread only
    adds synchronisation, and on a busy 2-core box two spinning threads make them many times
    slower."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def subjects():
    """``subject(name)``: the model of that name, built and run through ``generate()`` once."""
    built: dict[str, Subject] = {}

    def subject(name: str) -> Subject:
        if name not in built:
            tiny = MODELS[name]
            model = tiny.build()
            asked = tuple(requests(encoder_features=tiny.encoder_features))
            built[name] = Subject(
                tiny=tiny,
                model=model,
                requests=asked,
                reference={r.request_id: reference_generate(model, r) for r in asked},
            )
        return built[name]

    return subject
