"""Plugin tests: the conformance kit on the built-ins, the example plugin, the plugin controls."""

import sys
import textwrap

import pytest

#: A minimal third-party plugin module: one spec kind, ``acme.ring``, and no layout.
RING_PLUGIN = """
import attrs
from kvcore import KVCacheSpec, hookimpl
from kvcore.spec import cdiv


@attrs.frozen(kw_only=True)
class RingSpec(KVCacheSpec):
    kind = "acme.ring"
    slots: int = 4

    @property
    def page_size_bytes(self):
        return self.block_size * self.slots

    def max_num_blocks(self, context):
        return cdiv(min(context.max_model_len, 64), self.block_size)


@hookimpl
def kvcore_register_spec_kinds(register):
    register(RingSpec)
"""


@pytest.fixture
def install(tmp_path, monkeypatch):
    """``install(entry_point, source)``: a real distribution ``acme-kv-<entry_point> 1.0`` with one
    ``kvcore`` entry point whose module holds ``source``, in a folder put on ``sys.path``.

    Returns the module's name."""
    modules = []

    def make(entry_point="acme", source=RING_PLUGIN):
        module = f"acme_kv_{entry_point}_{len(modules)}"
        modules.append(module)
        (tmp_path / f"{module}.py").write_text(textwrap.dedent(source))
        info = tmp_path / f"acme_kv_{entry_point}-1.0.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: acme-kv-{entry_point}\nVersion: 1.0\n")
        (info / "entry_points.txt").write_text(f"[kvcore]\n{entry_point} = {module}\n")
        return module

    monkeypatch.syspath_prepend(tmp_path)
    yield make
    for module in modules:
        sys.modules.pop(module, None)
