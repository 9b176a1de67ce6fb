"""The registry: spec kinds and policies contributed by plugins, each with its origin.

Build one from a plugin manager (:meth:`Registry.from_plugin_manager`) or with the defaults
(:meth:`Registry.default`). Registration hooks are called plugin by plugin, each with a
``register`` callback bound to that plugin, so every kind and policy knows where it came from
and a duplicate names both sources.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable, Mapping
from functools import cached_property
from typing import TYPE_CHECKING, Any

import attrs

from kvcore.errors import (
    DuplicateRegistrationError,
    KVCoreError,
    PluginLoadError,
    PluginValidationError,
    PolicyNotApplicableError,
    UnknownPolicyError,
    UnknownSpecKindError,
)
from kvcore.planning.manager import KVCorePluginManager, PluginOrigin, get_plugin_manager
from kvcore.policy import AllocationPolicy
from kvcore.spec import KVCacheSpec, is_kv_cache_type_uniform

if TYPE_CHECKING:
    import cattrs

    from kvcore.cache_layout import CacheLayout

#: The policy ``auto`` picks for specs that can all share one block table, and otherwise.
AUTO_UNIFORM = "uniform"
AUTO_HYBRID = "shared_buffer"


@attrs.frozen(kw_only=True)
class Registered:
    """A registered spec kind or policy and where it came from.

    Attributes:
        name: the kind or policy name.
        obj: the spec class or the policy instance.
        origin: the plugin that registered it.
    """

    name: str
    obj: Any
    origin: PluginOrigin

    @property
    def qualname(self) -> str:
        """``module:QualName`` of the class (of the instance, for policies)."""
        cls = self.obj if isinstance(self.obj, type) else type(self.obj)
        return f"{cls.__module__}:{cls.__qualname__}"

    def describe(self) -> str:
        """``'module:Class' from builtin kvcore.plugins.mla'``."""
        return f"{self.qualname} from {self.origin.describe()}"


class Registry:
    """Spec kinds and policies by name, built from a plugin manager."""

    def __init__(self, pm: KVCorePluginManager) -> None:
        self.pm = pm
        self._kinds: dict[str, Registered] = {}
        self._policies: dict[str, Registered] = {}
        self._collect("kvcore_register_spec_kinds", self._add_kind)
        self._collect("kvcore_register_policies", self._add_policy)

    @classmethod
    def from_plugin_manager(cls, pm: KVCorePluginManager) -> Registry:
        """Build the registry by calling the registration hooks of ``pm``'s plugins."""
        return cls(pm)

    @classmethod
    def default(cls, **kwargs: Any) -> Registry:
        """A registry over a fresh :func:`~kvcore.get_plugin_manager` (same keyword arguments)."""
        return cls(get_plugin_manager(**kwargs))

    # -- registration ----------------------------------------------------------------------

    def _collect(self, hook_name: str, add: Callable[[Any, PluginOrigin], None]) -> None:
        hook = getattr(self.pm.hook, hook_name)
        plugins = self.pm.get_plugins()
        for impl in hook.get_hookimpls():
            origin = self.pm.origin_of(impl.plugin)
            others = [p for p in plugins if p is not impl.plugin]
            caller = self.pm.subset_hook_caller(hook_name, remove_plugins=others)
            try:
                caller(register=lambda obj, _origin=origin: add(obj, _origin))
            except KVCoreError:
                raise
            except Exception as exc:
                raise PluginLoadError(
                    f"plugin {origin.describe()} failed in {hook_name}: {type(exc).__name__}: {exc}"
                ) from exc

    def _add_kind(self, cls: object, origin: PluginOrigin) -> None:
        where = f"plugin {origin.describe()}"
        if not isinstance(cls, type) or not issubclass(cls, KVCacheSpec):
            raise PluginValidationError(
                f"{where} registered {cls!r} as a spec kind, but register() takes a subclass of "
                "kvcore.KVCacheSpec"
            )
        if not attrs.has(cls) or cls.__hash__ is None:
            raise PluginValidationError(
                f"{where}: spec class {cls.__qualname__} must be a frozen attrs class; "
                "decorate it with @attrs.frozen(kw_only=True)"
            )
        if inspect.isabstract(cls):
            missing = ", ".join(sorted(getattr(cls, "__abstractmethods__", ())))
            raise PluginValidationError(
                f"{where}: spec class {cls.__qualname__} does not implement {missing}"
            )
        kind = getattr(cls, "kind", "")
        if not isinstance(kind, str) or not kind:
            raise PluginValidationError(
                f"{where}: spec class {cls.__qualname__} needs a non-empty 'kind' class attribute "
                f"(got {kind!r})"
            )
        entry = Registered(name=kind, obj=cls, origin=origin)
        if kind in self._kinds:
            first = self._kinds[kind]
            raise DuplicateRegistrationError(
                f"spec kind {kind!r} is registered twice: by {first.describe()} and by "
                f"{entry.describe()}; uninstall or block one of the two plugins"
            )
        self._kinds[kind] = entry
        self.__dict__.pop("converter", None)

    def _add_policy(self, policy: object, origin: PluginOrigin) -> None:
        where = f"plugin {origin.describe()}"
        if isinstance(policy, type):
            raise PluginValidationError(
                f"{where} registered the class {policy.__qualname__}; register() takes a policy "
                "instance, e.g. register(MyPolicy())"
            )
        if not isinstance(policy, AllocationPolicy):
            raise PluginValidationError(
                f"{where} registered {policy!r}, which is not an allocation policy: it needs "
                "'name', 'description', why_not(), group() and layout()"
            )
        name = policy.name
        if not isinstance(name, str) or not name or name == "auto":
            raise PluginValidationError(
                f"{where}: a policy needs a non-empty name other than 'auto' (got {name!r})"
            )
        entry = Registered(name=name, obj=policy, origin=origin)
        if name in self._policies:
            first = self._policies[name]
            raise DuplicateRegistrationError(
                f"policy {name!r} is registered twice: by {first.describe()} and by "
                f"{entry.describe()}; uninstall or block one of the two plugins"
            )
        self._policies[name] = entry

    # -- lookups ---------------------------------------------------------------------------

    @property
    def kinds(self) -> Mapping[str, type[KVCacheSpec]]:
        """Spec classes by kind name, in registration order."""
        return {name: entry.obj for name, entry in self._kinds.items()}

    @property
    def policies(self) -> Mapping[str, AllocationPolicy]:
        """Policies by name, in registration order."""
        return {name: entry.obj for name, entry in self._policies.items()}

    def kind_entries(self) -> Iterable[Registered]:
        """Every registered kind with its origin."""
        return tuple(self._kinds.values())

    def policy_entries(self) -> Iterable[Registered]:
        """Every registered policy with its origin."""
        return tuple(self._policies.values())

    def spec_class(self, kind: str) -> type[KVCacheSpec]:
        """The spec class registered for ``kind``.

        Raises:
            UnknownSpecKindError: listing the registered kinds.
        """
        try:
            return self._kinds[kind].obj  # type: ignore[no-any-return]
        except KeyError:
            known = ", ".join(sorted(self._kinds)) or "none"
            raise UnknownSpecKindError(
                f"unknown spec kind {kind!r}; registered kinds: {known}. A kind from a plugin "
                "package needs that package installed (see `kvcore plugins`)"
            ) from None

    def policy(self, name: str) -> AllocationPolicy:
        """The policy registered as ``name``.

        Raises:
            UnknownPolicyError: listing the registered policies.
        """
        try:
            return self._policies[name].obj  # type: ignore[no-any-return]
        except KeyError:
            known = ", ".join(["auto", *self._policies])
            raise UnknownPolicyError(f"unknown policy {name!r}; choose one of {known}") from None

    def select(self, specs: Mapping[str, KVCacheSpec], name: str = "auto") -> AllocationPolicy:
        """The policy to plan ``specs`` with.

        ``"auto"`` picks ``uniform`` when :func:`~kvcore.is_kv_cache_type_uniform` holds and
        ``shared_buffer`` otherwise (or, if those are blocked, the first registered policy
        that can plan the specs). Any other name must be a registered policy that can.

        Raises:
            UnknownPolicyError: no such policy.
            PolicyNotApplicableError: the policy cannot plan these specs; says why.
        """
        if name == "auto":
            preferred = AUTO_UNIFORM if is_kv_cache_type_uniform(specs) else AUTO_HYBRID
            order = [preferred, *(n for n in self._policies if n != preferred)]
            reasons = []
            for candidate in order:
                if candidate not in self._policies:
                    continue
                policy = self.policy(candidate)
                reason = policy.why_not(specs)
                if reason is None:
                    return policy
                reasons.append(f"{candidate}: {reason}")
            raise PolicyNotApplicableError(
                "no registered policy can plan these layers ("
                + "; ".join(reasons or ["none registered"])
                + ")"
            )
        policy = self.policy(name)
        reason = policy.why_not(specs)
        if reason is not None:
            raise PolicyNotApplicableError(f"policy {name!r} cannot plan these layers: {reason}")
        return policy

    @cached_property
    def converter(self) -> cattrs.Converter:
        """The JSON converter for this registry's kinds (built after all plugins loaded)."""
        from kvcore.planning.serialization import make_converter

        return make_converter(self)

    def cache_layout(self, spec: KVCacheSpec) -> CacheLayout:
        """The page layout of ``spec`` from the ``kvcore_cache_layout`` hook, checked to fit.

        Raises:
            PluginValidationError: no plugin gives a layout for this kind.
            InvalidSpecError: the layout does not fit in one page.
        """
        from kvcore.cache_layout import CacheLayout

        layout = self.pm.hook.kvcore_cache_layout(spec=spec)
        if layout is None:
            raise PluginValidationError(
                f"no plugin gives a cache layout for spec kind {spec.kind!r}; the plugin that "
                "registers the kind should implement kvcore_cache_layout"
            )
        if not isinstance(layout, CacheLayout):
            raise PluginValidationError(
                f"kvcore_cache_layout returned {layout!r} for kind {spec.kind!r}; expected a "
                "kvcore.cache_layout.CacheLayout"
            )
        layout.check_fits(spec.page_size_bytes, f"spec kind {spec.kind!r}")
        return layout
