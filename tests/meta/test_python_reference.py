"""docs/reference/python.md stays true: every member it lists exists (callable where it shows
a call), and every public member of the plan objects, the options and the capacity is listed."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest
import torch

import kvcore
from kvcore.planning.request import MaxModelLen, PlanRequest
from tests.helpers import full, mix, sliding

PAGE = Path(__file__).parents[2] / "docs" / "reference" / "python.md"
ROW = re.compile(r"^\| `([A-Za-z_][\w.]*)(\([^`]*\))?` \|", re.M)
#: Classes whose every public member the page must list.
COMPLETE = (
    kvcore.KVCachePlan, kvcore.KVCacheGroup, kvcore.KVCacheTensor, kvcore.PlanOptions, kvcore.Capacity,
    PlanRequest, MaxModelLen,
)  # fmt: skip


def _documented() -> list[tuple[str, bool]]:
    return [(name, bool(call)) for name, call in ROW.findall(PAGE.read_text(encoding="utf-8"))]


@pytest.fixture(scope="module")
def instances(registry):
    plan = kvcore.plan_kv_cache(
        mix((3, full(heads=2, head_size=32)), (3, sliding(64, heads=2, head_size=32))),
        2**24,
        kvcore.SizingContext(max_model_len=1024),
        registry=registry,
    )
    executor = kvcore.LocalExecutor(torch.nn.Linear(2, 2), "cpu", registry=registry, kv_cache_bytes=2**20)
    return {
        "KVCachePlan": plan,
        "KVCacheGroup": plan.groups[0],
        "KVCacheSpec": plan.groups[0].spec,
        "KVCacheTensor": plan.tensors[0],
        "PlanOptions": kvcore.PlanOptions(),
        "BlockPool": kvcore.BlockPool(plan),
        "Capacity": kvcore.Capacity.of(plan),
        "LocalExecutor": executor,
        "DistributedExecutor": kvcore.DistributedExecutor,
        "PlanRequest": PlanRequest(specs=mix((1, full())), budgets=2**24, max_model_len=1024),
        "MaxModelLen": MaxModelLen.up_to(1024),
    }


@pytest.fixture(scope="module")
def registry():
    return kvcore.Registry.default()


def test_the_page_lists_members(instances):
    assert len(_documented()) > 60


def test_every_listed_member_exists(instances):
    missing = []
    for name, call in _documented():
        if name.startswith("kvcore."):
            module, _, attr = name.rpartition(".")
            target = getattr(importlib.import_module(module), attr, None)
        else:
            owner, _, attr = name.partition(".")
            assert owner in instances, f"{name}: the test knows no {owner}; add an instance"
            target = getattr(instances[owner], attr, None)
            if target is None and not hasattr(instances[owner], attr):
                missing.append(name)
                continue
        if name.startswith("kvcore.") and target is None:
            missing.append(name)
        elif call and not callable(target):
            missing.append(f"{name} (not callable)")
    assert missing == []


@pytest.mark.parametrize("cls", COMPLETE, ids=lambda c: c.__name__)
def test_every_public_member_is_listed(cls):
    listed = {name.partition(".")[2] for name, _ in _documented() if name.startswith(cls.__name__ + ".")}
    public = {name for name in dir(cls) if not name.startswith("_")}
    assert public - listed == set(), f"document these {cls.__name__} members in {PAGE.name}"
