"""Plugin loading and registration: built-ins, entry points, duplicates, failures."""

import importlib.metadata
import sys
import types
from typing import ClassVar

import attrs
import pytest

from kvcore import (
    DuplicateRegistrationError,
    InvalidInputError,
    KVCacheSpec,
    ModelFamily,
    ModelOptions,
    PluginLoadError,
    PluginValidationError,
    PolicyNotApplicableError,
    Registry,
    UnknownModelError,
    UnknownPolicyError,
    UnknownSpecKindError,
    get_plugin_manager,
    hookimpl,
)
from kvcore.planning.manager import BUILTIN_PLUGINS
from kvcore.plugins.full_attention import FullAttentionSpec
from kvcore.spec import SizingContext, cdiv
from tests.helpers import BUILTIN_KINDS, full, registering, sliding


def test_builtins_register_through_hooks(registry):
    assert list(registry.kinds) == list(BUILTIN_KINDS)
    assert list(registry.policies) == [
        "uniform",
        "shared_buffer",
        "equal_groups",
        "kind_pools",
        "unified_pool",
    ]
    entry = {e.name: e for e in registry.kind_entries()}["mla"]
    assert entry.origin.source == "builtin"
    assert entry.origin.name == "kvcore.plugins.mla"
    assert entry.qualname == "kvcore.plugins.mla:MLAAttentionSpec"


def test_no_global_state_between_managers():
    a = get_plugin_manager(autoload=False)
    b = get_plugin_manager(autoload=False)
    assert a is not b
    a.unregister(name="kvcore.plugins.mla")
    assert "mla" in Registry(b).kinds
    assert "mla" not in Registry(a).kinds


def test_blocking_a_builtin(make_registry):
    reg = make_registry(block=["kvcore.plugins.mla"])
    assert "mla" not in reg.kinds
    with pytest.raises(UnknownSpecKindError, match="unknown spec kind 'mla'; registered kinds: chunked"):
        reg.spec_class("mla")


def test_blocking_from_environment(monkeypatch):
    monkeypatch.setenv("KVCORE_BLOCK_PLUGINS", "kvcore.policies.uniform, kvcore.plugins.mla")
    reg = Registry.default(autoload=False)
    assert "uniform" not in reg.policies
    assert "mla" not in reg.kinds


@attrs.frozen(kw_only=True)
class AcmeSpec(KVCacheSpec):
    kind = "acme.ring"
    slots: int = 4

    @property
    def page_size_bytes(self) -> int:
        return self.block_size * self.slots

    def max_num_blocks(self, context: SizingContext) -> int:
        return cdiv(min(context.max_model_len, 64), self.block_size)


class AcmePlugin:
    @hookimpl
    def kvcore_register_spec_kinds(self, register):
        register(AcmeSpec)


def test_third_party_kind_registers(make_registry):
    reg = make_registry(AcmePlugin())
    assert reg.spec_class("acme.ring") is AcmeSpec
    entry = {e.name: e for e in reg.kind_entries()}["acme.ring"]
    assert entry.origin.source == "explicit"


def test_duplicate_kind_names_both_sources(make_registry):
    class Clash:
        @hookimpl
        def kvcore_register_spec_kinds(self, register):
            register(Imposter)

    @attrs.frozen(kw_only=True)
    class Imposter(FullAttentionSpec):
        kind = "full_attention"

    with pytest.raises(DuplicateRegistrationError) as info:
        make_registry(Clash())
    message = str(info.value)
    assert (
        "kvcore.plugins.full_attention:FullAttentionSpec from builtin kvcore.plugins.full_attention"
        in message
    )
    assert "Imposter" in message and "explicit" in message


def test_duplicate_policy_names_both_sources(make_registry):
    from kvcore.policies.uniform import UniformPolicy

    class Again:
        @hookimpl
        def kvcore_register_policies(self, register):
            register(UniformPolicy())

    with pytest.raises(
        DuplicateRegistrationError, match=r"policy 'uniform' is registered twice: by .* and by"
    ):
        make_registry(Again())


class _Registers:
    """A plugin that registers one object (a spec class, or not) as a kind."""

    def __init__(self, cls):
        self.cls = cls

    @hookimpl
    def kvcore_register_spec_kinds(self, register):
        register(self.cls)


@pytest.mark.parametrize(
    ("obj", "match"),
    [
        (int, "subclass of kvcore.KVCacheSpec"),
        (FullAttentionSpec(block_size=1, num_kv_heads=1, head_size=1, dtype="float32"), "subclass"),
    ],
)
def test_bad_kind_registration(make_registry, obj, match):
    with pytest.raises(PluginValidationError, match=match):
        make_registry(_Registers(obj))


def test_kind_needs_a_name_and_implementations(make_registry):
    @attrs.frozen(kw_only=True)
    class Nameless(AcmeSpec):
        kind = ""

    @attrs.frozen(kw_only=True)
    class Abstract(KVCacheSpec):
        kind = "acme.abstract"

    with pytest.raises(PluginValidationError, match="non-empty 'kind'"):
        make_registry(_Registers(Nameless))
    # max_num_blocks has a default (read off live_pages): only the page size is left to write
    with pytest.raises(
        PluginValidationError,
        match=r"spec kind 'acme.abstract' \(.*Abstract\) does not implement page_size_bytes$",
    ):
        make_registry(_Registers(Abstract))


def test_a_subclass_that_adds_fields_without_attrs_is_refused_naming_the_kind_and_plugin(make_registry):
    class Undecorated(AcmeSpec):  # its field would silently drop out of JSON
        kind = "acme.undecorated"
        extra: int = 3

    with pytest.raises(PluginValidationError) as info:
        make_registry(_Registers(Undecorated))
    message = str(info.value)
    assert "spec kind 'acme.undecorated'" in message and "_Registers" in message  # kind and plugin
    assert "adds the fields extra but is not an attrs class" in message
    assert "@attrs.frozen(kw_only=True)" in message


def test_a_plain_class_in_the_middle_of_the_mro_is_refused_too(make_registry):
    class Middle(AcmeSpec):
        middle: int = 1

    @attrs.frozen(kw_only=True)
    class Bottom(Middle):
        kind = "acme.bottom"

    with pytest.raises(
        PluginValidationError, match=r"spec kind 'acme.bottom' .*Middle adds the fields middle"
    ):
        make_registry(_Registers(Bottom))


def test_a_subclass_that_only_renames_the_kind_needs_no_decorator(make_registry):
    class Renamed(AcmeSpec):  # no fields of its own: attrs fields and JSON come from AcmeSpec
        kind: ClassVar[str] = "acme.renamed"

        def max_num_blocks(self, context):
            return 1

    registry = make_registry(_Registers(Renamed))
    assert registry.spec_class("acme.renamed") is Renamed


def test_a_subclass_that_is_not_frozen_is_refused(make_registry):
    @attrs.frozen(kw_only=True)
    class Thawed(AcmeSpec):
        kind = "acme.thawed"

    Thawed.__setattr__ = object.__setattr__  # thawed after attrs froze it (attrs refuses otherwise)

    with pytest.raises(PluginValidationError, match=r"spec kind 'acme.thawed' .*Thawed is not frozen"):
        make_registry(_Registers(Thawed))


def test_policy_registration_checks(make_registry):
    from kvcore.policies.uniform import UniformPolicy

    class ClassNotInstance:
        @hookimpl
        def kvcore_register_policies(self, register):
            register(UniformPolicy)

    class NotAPolicy:
        @hookimpl
        def kvcore_register_policies(self, register):
            register(object())

    with pytest.raises(PluginValidationError, match="register\\(MyPolicy\\(\\)\\)"):
        make_registry(ClassNotInstance())
    with pytest.raises(PluginValidationError, match="not an allocation policy"):
        make_registry(NotAPolicy())


def test_misspelled_hook_is_reported(make_registry):
    class Typo:
        @hookimpl
        def kvcore_register_spec_kind(self, register):  # missing "s"
            pass

    with pytest.raises(PluginValidationError, match="does not have"):
        make_registry(Typo())


def test_failure_inside_a_hook_names_the_plugin(make_registry):
    class Broken:
        @hookimpl
        def kvcore_register_policies(self, register):
            raise RuntimeError("boom")

    with pytest.raises(
        PluginLoadError, match=r"Broken.*failed in kvcore_register_policies: RuntimeError: boom"
    ):
        make_registry(Broken())


class _FakeDist:
    def __init__(self, name, version="1.0"):
        self.metadata = {"Name": name}
        self.version = version


def _fake_entry_points(monkeypatch, *eps):
    def entry_points(group=None):
        return [ep for ep in eps if ep.group == group]

    monkeypatch.setattr(importlib.metadata, "entry_points", entry_points)


def _ep(name, value, dist):
    ep = importlib.metadata.EntryPoint(name=name, value=value, group="kvcore")
    return ep._for(dist) if hasattr(ep, "_for") else ep


def test_entry_point_plugins_load_with_their_distribution(monkeypatch):
    module = types.ModuleType("acme_kv_plugin")
    module.kvcore_register_spec_kinds = hookimpl(lambda register: register(AcmeSpec))
    monkeypatch.setitem(sys.modules, "acme_kv_plugin", module)
    _fake_entry_points(monkeypatch, _ep("acme", "acme_kv_plugin", _FakeDist("kvcore-acme", "2.1")))
    reg = Registry.default()
    entry = {e.name: e for e in reg.kind_entries()}["acme.ring"]
    assert entry.origin.source == "entry point"
    assert entry.origin.distribution == "kvcore-acme"
    assert entry.origin.version == "2.1"
    assert "acme" not in Registry.default(autoload=False).kinds


def test_entry_point_import_failure_names_the_plugin(monkeypatch):
    _fake_entry_points(monkeypatch, _ep("broken", "no_such_module_xyz", _FakeDist("kvcore-broken")))
    with pytest.raises(PluginLoadError) as info:
        get_plugin_manager(strict=True)
    message = str(info.value)
    assert "'broken'" in message and "kvcore-broken" in message and "no_such_module_xyz" in message
    assert isinstance(info.value.__cause__, ImportError)
    # and the environment switch turns autoloading off
    monkeypatch.setenv("KVCORE_DISABLE_PLUGIN_AUTOLOAD", "1")
    get_plugin_manager()


def test_select_auto(registry):
    assert registry.select({"a": full(), "b": full()}).name == "uniform"
    assert registry.select({"a": full(), "b": sliding(128)}).name == "shared_buffer"


def test_select_named_and_errors(registry):
    assert registry.select({"a": full(), "b": full()}, "shared_buffer").name == "shared_buffer"
    choices = "choose one of auto, uniform, shared_buffer, equal_groups, kind_pools, unified_pool"
    with pytest.raises(UnknownPolicyError, match=choices):
        registry.select({"a": full()}, "greedy")
    with pytest.raises(PolicyNotApplicableError) as info:
        registry.select({"a": full(), "b": sliding(128)}, "uniform")
    message = str(info.value)
    assert message.count(".") <= 3  # one sentence (dots in dtype names aside)
    assert "'a' is full_attention" in message and "'b' is sliding_window" in message
    assert "use the shared_buffer policy" in message


def test_auto_falls_back_when_preferred_policy_is_blocked(make_registry):
    reg = make_registry(block=["kvcore.policies.uniform"])
    assert reg.select({"a": full()}).name == "shared_buffer"


def test_builtin_list_names_real_modules():
    import importlib

    for name in BUILTIN_PLUGINS:
        # kinds and families, policies, and the scheduler profiles (beside the simulator they drive)
        homes = ("kvcore.plugins.", "kvcore.policies.")
        assert name.startswith(homes) or name == "kvcore.simulation.profiles"
        importlib.import_module(name)


# -- model families ------------------------------------------------------------------------


LLAMA_LIKE = {
    "model_type": "llama",
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 8,
}


def _family_plugin(*families):
    return registering("kvcore_register_model_families", *families)


def _one_layer(config, options):
    return {
        "acme.0": FullAttentionSpec(
            block_size=options.block_size, num_kv_heads=1, head_size=8, dtype="float32"
        )
    }


def test_builtin_families_register_with_their_origin(registry):
    families = registry.model_families
    assert families["llama"].name == "llama"
    assert families["deepseek_v3"].name == "deepseek"
    entries = {e.name: e for e in registry.family_entries()}
    assert entries["gemma2"].origin.name == "kvcore.plugins.models.attention_only"
    assert entries["jamba"].origin.name == "kvcore.plugins.models.jamba"
    assert entries["generic"].obj.fallback is not None  # the fallback, claiming no model type
    assert not entries["generic"].obj.model_types


def test_duplicate_model_type_names_both_families_and_plugins(make_registry):
    clash = ModelFamily(name="acme_llama", model_types=("acme", "llama"), layer_specs=_one_layer)
    with pytest.raises(DuplicateRegistrationError) as info:
        make_registry(_family_plugin(clash))
    message = str(info.value)
    assert message.startswith("model type 'llama' is claimed twice: ")
    assert "family 'llama' from builtin kvcore.plugins.models.attention_only" in message
    assert "family 'acme_llama' from explicit " in message
    assert "uninstall or block one of the two plugins" in message


def test_two_third_party_plugins_claiming_one_type(make_registry):
    class First:
        @hookimpl
        def kvcore_register_model_families(self, register):
            register(ModelFamily(name="one", model_types=("acme",), layer_specs=_one_layer))

    class Second:
        @hookimpl
        def kvcore_register_model_families(self, register):
            register(ModelFamily(name="two", model_types=("acme",), layer_specs=_one_layer))

    with pytest.raises(DuplicateRegistrationError, match="model type 'acme' is claimed twice") as info:
        make_registry(First(), Second())
    message = str(info.value)
    assert "family 'one' from explicit " in message and "<locals>.First" in message
    assert "family 'two' from explicit " in message and "<locals>.Second" in message


def test_blocking_the_builtin_lets_a_plugin_claim_its_type(make_registry):
    mine = ModelFamily(name="my_llama", model_types=("llama",), layer_specs=_one_layer)
    reg = make_registry(_family_plugin(mine), block=["kvcore.plugins.models.attention_only"])
    assert list(reg.layer_specs(LLAMA_LIKE)) == ["acme.0"]
    assert "mistral" not in reg.model_families


def test_families_receive_typed_options(make_registry):
    seen = []

    def spy(config, options):
        seen.append(options)
        return _one_layer(config, options)

    reg = make_registry(_family_plugin(ModelFamily(name="spy", model_types=("acme",), layer_specs=spy)))
    reg.layer_specs({"model_type": "acme"}, {"tp": 2, "kv_cache_dtype": "fp8"})
    reg.layer_specs({"model_type": "acme"}, ModelOptions(block_size=32))
    reg.layer_specs({"model_type": "acme"})
    assert seen == [ModelOptions(tp=2, kv_cache_dtype="fp8"), ModelOptions(block_size=32), ModelOptions()]
    assert all(isinstance(options, ModelOptions) for options in seen)


def test_layer_specs_refuses_an_unknown_option_before_any_family_runs(registry):
    with pytest.raises(
        InvalidInputError, match=r"unknown model options \['pp'\]; known options: \['block_size',"
    ):
        registry.layer_specs(LLAMA_LIKE, {"tp": 2, "pp": 2})


def test_a_later_fallback_is_asked_before_the_generic_one(make_registry):
    mine = ModelFamily(name="mine", layer_specs=_one_layer, fallback=lambda config: "acme_hint" in config)
    reg = make_registry(_family_plugin(mine))
    listed = {
        "model_type": "new",
        "layer_types": ["full_attention"],
        **{k: v for k, v in LLAMA_LIKE.items() if k != "model_type"},
    }
    assert list(reg.layer_specs({**listed, "num_hidden_layers": 1})) == [
        "model.layers.0.self_attn"
    ]  # generic
    assert list(reg.layer_specs({**listed, "num_hidden_layers": 1, "acme_hint": True})) == ["acme.0"]
    assert reg.family_for({"model_type": "llama", "acme_hint": True}).name == "llama"  # a claim wins


def test_unknown_model_type_names_the_hook(registry):
    with pytest.raises(UnknownModelError, match="no model-family plugin knows model type 'acme'") as info:
        registry.layer_specs({"model_type": "acme"})
    assert "registers a model family" in str(info.value)


@pytest.mark.parametrize(
    ("answer", "match"),
    [
        ([], "model family 'bad' returned list for model type 'acme'; expected a mapping"),
        ({"x": 1}, "model family 'bad' answered badly for model type 'acme'"),
    ],
)
def test_a_family_answer_is_checked(make_registry, answer, match):
    bad = ModelFamily(name="bad", model_types=("acme",), layer_specs=lambda config, options: answer)
    reg = make_registry(_family_plugin(bad))
    with pytest.raises(PluginValidationError, match=match):
        reg.layer_specs({"model_type": "acme"})


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"name": "", "model_types": ("a",), "layer_specs": _one_layer}, "non-empty name"),
        (
            {"name": "a", "model_types": "acme", "layer_specs": _one_layer},
            r"sequence of names such as \('llama',\)",
        ),
        ({"name": "a", "model_types": ("",), "layer_specs": _one_layer}, "non-empty strings"),
        ({"name": "a", "model_types": ("a",), "layer_specs": "nope"}, "layer_specs must be callable"),
        ({"name": "a", "layer_specs": _one_layer}, "claims nothing"),
    ],
)
def test_model_family_checks_itself(kwargs, match):
    with pytest.raises(PluginValidationError, match=match):
        ModelFamily(**kwargs)


def test_registering_something_else_as_a_family(make_registry):
    with pytest.raises(
        PluginValidationError, match=r"registered 'llama' as a model family, but register\(\) takes"
    ):
        make_registry(_family_plugin("llama"))


def test_spec_for_module_checks_the_answer_and_passes_typed_options(make_registry):
    seen = []

    class Scanner:
        @hookimpl
        def kvcore_spec_for_module(self, module, name, options):
            seen.append(options)
            return "not a spec" if name == "bad" else None

    reg = make_registry(Scanner())
    assert reg.spec_for_module(object(), "fine", {"block_size": 8}) is None
    assert seen == [ModelOptions(block_size=8)]
    with pytest.raises(PluginValidationError, match="returned 'not a spec' for module 'bad'"):
        reg.spec_for_module(object(), "bad")
