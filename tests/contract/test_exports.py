"""The public façade: every name is written once (the TYPE_CHECKING block of kvcore/__init__.py)
and reachable; the 0.1 names keep working with a DeprecationWarning naming the replacement."""

import subprocess
import sys

import pytest

import kvcore


@pytest.mark.parametrize(
    ("old", "new"),
    [("KVCacheConfig", "KVCachePlan"), ("Layout", "BlockPlacement"), ("RankLayout", "Parallelism")],
)
def test_the_0_1_names_still_reach_the_renamed_classes_with_a_warning(old, new):
    with pytest.warns(
        DeprecationWarning, match=rf"kvcore\.{old} is deprecated: use kvcore\.{new} \(removed in"
    ):
        value = getattr(kvcore, old)
    assert value is getattr(kvcore, new)
    assert old not in kvcore.__all__


def test_every_public_name_is_reachable_and_listed_once():
    assert len(kvcore.__all__) == len(set(kvcore.__all__))
    for name in kvcore.__all__:
        assert getattr(kvcore, name) is not None, name
    # the lazy names are exactly the TYPE_CHECKING re-exports, each from the module that defines it
    for name, module in kvcore._LAZY.items():
        assert name in kvcore.__all__ and module.startswith("kvcore."), name
    assert {"plan_kv_cache", "BlockPool", "PluginFailedWarning", "hookimpl", "KVCoreError"} <= set(
        kvcore.__all__
    )
    assert not {"errors", "hookspecs"} & set(kvcore.__all__)  # submodules are not names of the façade


def test_importing_kvcore_stays_torch_free():
    code = "import sys, kvcore; kvcore.plan_kv_cache; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"
