"""The registry: spec kinds, policies and model families contributed by plugins, each with its
origin, and the one place that calls the plugins' other hooks.

Build one from a plugin manager (:meth:`Registry.from_plugin_manager`) or with the defaults
(:meth:`Registry.default`). Registration hooks are called plugin by plugin, each with a
``register`` callback bound to that plugin, so every kind, policy and model family knows where
it came from and a duplicate names both sources. The rest of kvcore asks the registry, never
the plugin manager's hooks: :meth:`Registry.layer_specs` (a config, through the family that
claims its model type), :meth:`Registry.spec_for_module` (a module, through
``kvcore_spec_for_module``) and :meth:`Registry.cache_layout` (through ``kvcore_cache_layout``).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

import attrs

from kvcore.error_messages import did_you_mean
from kvcore.errors import (
    DuplicateRegistrationError,
    InvalidSpecError,
    KVCoreError,
    ModelConfigError,
    PluginLoadError,
    PluginValidationError,
    PolicyNotApplicableError,
    UnknownModelError,
    UnknownPolicyError,
    UnknownSchedulerError,
    UnknownSpecKindError,
)
from kvcore.model_family import ADD_FAMILY_DOC, ModelFamily
from kvcore.model_options import ModelOptions, to_model_options
from kvcore.planning.manager import KVCorePluginManager, PluginOrigin, get_plugin_manager
from kvcore.policy import AllocationPolicy, PolicyChoice
from kvcore.spec import KVCacheSpec, check_layer_specs, spec_class_problems, specs_by_group_key
from kvcore.validators import is_int

if TYPE_CHECKING:
    from kvcore.cache_layout import CacheLayout


@attrs.frozen(kw_only=True)
class Registered:
    """A registered spec kind, policy or model family and where it came from.

    Attributes:
        name: the kind, policy or family name.
        obj: the spec class, the policy instance or the :class:`~kvcore.model_family.ModelFamily`.
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
    """Spec kinds, policies and model families by name, built from a plugin manager."""

    def __init__(self, pm: KVCorePluginManager) -> None:
        self.pm = pm
        self._kinds: dict[str, Registered] = {}
        self._policies: dict[str, Registered] = {}
        self._families: dict[str, Registered] = {}  # by model type
        self._fallbacks: list[Registered] = []  # in registration order
        self._profiles: dict[str, Registered] = {}  # scheduler profiles (the simulation's)
        self._collect("kvcore_register_spec_kinds", self._add_kind)
        self._collect("kvcore_register_policies", self._add_policy)
        self._collect("kvcore_register_model_families", self._add_family)
        self._collect("kvcore_register_scheduler_profiles", self._add_profile)

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
        """Call a registration hook plugin by plugin; ``add(obj, origin)`` for each registration.

        A third-party plugin whose registration fails is dropped whole (what it registered in
        earlier hooks too) when the plugin manager is not strict, so the rest still loads.
        """
        for origin, call in self._each_plugin(hook_name):
            try:
                with self.pm.noting_deprecations(origin.name):
                    call(register=lambda obj, _origin=origin: add(obj, _origin))
            except KVCoreError as exc:
                self.pm.skip_or_raise(origin, "registration", exc)
                self._drop(origin.name)

    def _drop(self, plugin_name: str) -> None:
        """Forget every kind, policy and model family the plugin ``plugin_name`` registered."""
        for table in (self._kinds, self._policies, self._families, self._profiles):
            for key in [key for key, entry in table.items() if entry.origin.name == plugin_name]:
                del table[key]
        self._fallbacks = [entry for entry in self._fallbacks if entry.origin.name != plugin_name]

    def _each_plugin(
        self, hook_name: str, *, reverse: bool = False
    ) -> Iterator[tuple[PluginOrigin, Callable[..., Any]]]:
        """One caller per plugin implementing ``hook_name``, so that each registration is known
        to come from its plugin. Calls go through the plugin manager (tracing sees them); an
        exception other than a :class:`KVCoreError` becomes a :class:`PluginLoadError` naming
        the plugin. ``reverse`` gives pluggy's own call order (plugins registered last first).
        """
        impls = getattr(self.pm.hook, hook_name).get_hookimpls()
        plugins = self.pm.get_plugins()
        for impl in reversed(impls) if reverse else impls:
            origin = self.pm.origin_of(impl.plugin)
            others = [p for p in plugins if p is not impl.plugin]
            caller = self.pm.subset_hook_caller(hook_name, remove_plugins=others)

            def call(_caller: Any = caller, _origin: PluginOrigin = origin, **kwargs: Any) -> Any:
                try:
                    return _caller(**kwargs)
                except KVCoreError:
                    raise
                except Exception as exc:
                    raise PluginLoadError(
                        f"plugin {_origin.describe()} failed in {hook_name}: {type(exc).__name__}: {exc}"
                    ) from exc

            yield origin, call

    def spec_strategies(self, **arguments: Any) -> list[tuple[PluginOrigin, type[KVCacheSpec], Any]]:
        """What the plugins register through ``kvcore_register_spec_strategies``.

        Used by the testing kit (:mod:`kvcore.testing.strategies`); planning never calls it, and
        the registry never imports hypothesis: the strategies are opaque objects here.

        Args:
            arguments: the hook's other arguments (``block_sizes``, ``dtypes``).

        Returns:
            ``(plugin origin, spec class, strategy)`` for every registration, in pluggy's call
            order (plugins registered last first).
        """
        found: list[tuple[PluginOrigin, type[KVCacheSpec], Any]] = []
        for origin, call in self._each_plugin("kvcore_register_spec_strategies", reverse=True):

            def register(spec_cls: type[KVCacheSpec], strategy: Any, _origin: PluginOrigin = origin) -> None:
                found.append((_origin, spec_cls, strategy))

            call(register=register, **arguments)
        return found

    def _add_kind(self, cls: object, origin: PluginOrigin) -> None:
        where = f"plugin {origin.describe()}"
        if not isinstance(cls, type) or not issubclass(cls, KVCacheSpec):
            raise PluginValidationError(
                f"{where} registered {cls!r} as a spec kind, but register() takes a subclass of "
                "kvcore.KVCacheSpec"
            )
        kind = getattr(cls, "kind", "")
        named = f"spec kind {kind!r} ({cls.__qualname__})" if kind else f"spec class {cls.__qualname__}"
        problems = spec_class_problems(cls)
        if not attrs.has(cls) or cls.__hash__ is None:
            raise PluginValidationError(
                f"{where}: {named} must be a frozen attrs class; decorate it with @attrs.frozen(kw_only=True)"
            )
        if problems:
            raise PluginValidationError(f"{where}: {named}: {'; '.join(problems)}")
        if inspect.isabstract(cls):
            missing = ", ".join(sorted(getattr(cls, "__abstractmethods__", ())))
            raise PluginValidationError(f"{where}: {named} does not implement {missing}")
        if not isinstance(kind, str) or not kind:
            raise PluginValidationError(
                f"{where}: spec class {cls.__qualname__} needs a non-empty 'kind' class attribute "
                f"(got {kind!r})"
            )
        _add_once(self._kinds, "spec kind", Registered(name=kind, obj=cls, origin=origin))

    def _add_policy(self, policy: object, origin: PluginOrigin) -> None:
        where = f"plugin {origin.describe()}"
        if isinstance(policy, type):
            raise PluginValidationError(
                f"{where} registered the class {policy.__qualname__}; register() takes a policy "
                "instance, e.g. register(MyPolicy())"
            )
        _check_0_1_policy(policy, where)
        if not isinstance(policy, AllocationPolicy):
            raise PluginValidationError(
                f"{where} registered {policy!r}, which is not an allocation policy: it needs "
                "'name', 'description', 'auto_priority', why_not(), group() and layout()"
            )
        name = policy.name
        if not isinstance(name, str) or not name or name == "auto":
            raise PluginValidationError(
                f"{where}: a policy needs a non-empty name other than 'auto' (got {name!r})"
            )
        _add_once(self._policies, "policy", Registered(name=name, obj=policy, origin=origin))

    def _add_family(self, family: object, origin: PluginOrigin) -> None:
        where = f"plugin {origin.describe()}"
        if not isinstance(family, ModelFamily):
            raise PluginValidationError(
                f"{where} registered {family!r} as a model family, but register() takes a "
                "kvcore.ModelFamily(name=..., model_types=..., layer_specs=...)"
            )
        entry = Registered(name=family.name, obj=family, origin=origin)
        for model_type in dict.fromkeys(family.model_types):
            first = self._families.get(model_type)
            if first is not None:
                raise DuplicateRegistrationError(
                    f"model type {model_type!r} is claimed twice: by {_describe_family(first)} and by "
                    f"{_describe_family(entry)}; uninstall or block one of the two plugins"
                )
            self._families[model_type] = entry
        if family.fallback is not None:
            self._fallbacks.append(entry)

    def _add_profile(self, profile: object, origin: PluginOrigin) -> None:
        """A scheduler profile: kept as an opaque object (the simulation layer, above planning,
        defines what it does), checked for the name and methods the simulation calls."""
        where = f"plugin {origin.describe()}"
        name = getattr(profile, "name", None)
        if isinstance(profile, type) or not callable(getattr(profile, "simulator", None)):
            raise PluginValidationError(
                f"{where} registered {profile!r} as a scheduler profile, but register() takes an "
                "instance with 'name', 'description' and simulator(plan, workload, ...)"
            )
        if not isinstance(name, str) or not name:
            raise PluginValidationError(f"{where}: a scheduler profile needs a non-empty name (got {name!r})")
        _add_once(self._profiles, "scheduler profile", Registered(name=name, obj=profile, origin=origin))

    # -- lookups ---------------------------------------------------------------------------

    @property
    def scheduler_profiles(self) -> Mapping[str, Any]:
        """Scheduler profiles by name, in registration order (what ``kvcore simulate
        --scheduler`` accepts; :class:`kvcore.simulation.profile.SchedulerProfile` objects)."""
        return {name: entry.obj for name, entry in self._profiles.items()}

    def profile_entries(self) -> Iterable[Registered]:
        """The registered scheduler profiles with their plugins."""
        return tuple(self._profiles.values())

    def scheduler_profile(self, name: str) -> Any:
        """The scheduler profile registered as ``name``.

        Raises:
            UnknownSchedulerError: listing the registered profiles.
        """
        try:
            return self._profiles[name].obj
        except KeyError:
            known = ", ".join(self._profiles) or "none (is kvcore.simulation.profiles blocked?)"
            raise UnknownSchedulerError(f"unknown scheduler {name!r}; choose one of {known}") from None

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

    @property
    def model_families(self) -> Mapping[str, ModelFamily]:
        """The family that claims each model type, in registration order."""
        return {model_type: entry.obj for model_type, entry in self._families.items()}

    def family_entries(self) -> Iterable[Registered]:
        """Every registered model family with its origin (fallbacks included), once each."""
        entries = {id(e.obj): e for e in (*self._families.values(), *self._fallbacks)}
        return tuple(entries.values())

    def family_for(self, config: Mapping[str, Any]) -> ModelFamily | None:
        """The family that reads ``config``: the one claiming its ``model_type``, else the
        first fallback (the latest registered first) whose test accepts it, else ``None``."""
        model_type = config.get("model_type")
        if isinstance(model_type, str) and model_type in self._families:
            return self._families[model_type].obj  # type: ignore[no-any-return]
        for entry in reversed(self._fallbacks):
            if entry.obj.fallback(config):
                return entry.obj  # type: ignore[no-any-return]
        return None

    # -- calling the plugins ---------------------------------------------------------------

    def layer_specs(
        self, config: Mapping[str, Any], options: ModelOptions | Mapping[str, Any] | None = None
    ) -> dict[str, KVCacheSpec]:
        """``{layer name: spec}`` for a parsed ``config.json``, from the family that claims it.

        Args:
            config: the parsed config (wrappers such as gemma3 / llama4 included).
            options: tensor parallelism, dtypes, block size; default :class:`ModelOptions`
                (a plain mapping is validated with :func:`~kvcore.model_options.to_model_options`).

        Returns:
            The cache-holding layers in model order.

        Raises:
            ModelConfigError: the config is not an object, or the family found a field missing
                or out of range (the message names the model type and the field).
            UnknownModelError: no family claims the model type and no fallback reads the config.
            PluginValidationError: the family answered something other than ``{name: spec}``.
            UnknownSpecKindError: the family built a spec whose kind no plugin registers.
            InvalidInputError: bad options.
        """
        if not isinstance(config, Mapping):
            raise ModelConfigError(f"a model config must be a JSON object (got a {type(config).__name__})")
        opts = to_model_options(options)
        family = self.family_for(config)
        model_type = config.get("model_type")
        if family is None:
            what = f"model type {model_type!r}" if model_type is not None else "a config without 'model_type'"
            close = did_you_mean(model_type, self._families) if isinstance(model_type, str) else ""
            raise UnknownModelError(
                f"no model-family plugin knows {what} and the config has no 'layer_types'; {close}install or "
                f"write a plugin that registers a model family for it ({ADD_FAMILY_DOC})"
            )
        result = family.layer_specs(config, opts)
        if not isinstance(result, Mapping):
            raise PluginValidationError(
                f"model family {family.name!r} returned {type(result).__name__} for model type "
                f"{model_type!r}; expected a mapping of layer name to spec"
            )
        specs = dict(result)
        if not specs:  # an attention-free or encoder-only model: nothing to cache, a valid answer
            return specs
        try:
            check_layer_specs(specs)
        except InvalidSpecError as exc:
            raise PluginValidationError(
                f"model family {family.name!r} answered badly for model type {model_type!r}: {exc}"
            ) from None
        for spec in specs.values():
            self.check_registered(spec, f"model family {family.name!r} (model type {model_type!r})")
        return specs

    def check_registered(self, spec: KVCacheSpec, source: str) -> None:
        """Refuse a spec whose kind no registered plugin provides (its plugin was blocked, say):
        a family or module hook may build spec classes directly.

        Args:
            spec: the spec.
            source: who built it, for the message.

        Raises:
            UnknownSpecKindError: naming the kind, ``source`` and the registered kinds.
        """
        if spec.kind not in self._kinds:
            known = ", ".join(sorted(self._kinds)) or "none"
            raise UnknownSpecKindError(
                f"{source} built {spec.kind!r} layers, but no registered plugin provides the spec kind "
                f"{spec.kind!r} (was its plugin blocked, with block= or KVCORE_BLOCK_PLUGINS?); "
                f"registered kinds: {known}"
            )

    def spec_for_module(
        self, module: object, name: str, options: ModelOptions | Mapping[str, Any] | None = None
    ) -> KVCacheSpec | None:
        """The spec the ``kvcore_spec_for_module`` plugins give one module (first answer wins).

        Args:
            module: a ``torch.nn.Module`` of the model being scanned.
            name: its qualified name in the model.
            options: the scan's model options (a plain mapping is validated first).

        Returns:
            The module's spec, or ``None`` when no plugin recognises it.

        Raises:
            PluginValidationError: a plugin answered something that is not a spec.
            InvalidInputError: bad options.
        """
        opts = to_model_options(options)
        spec = self.pm.hook.kvcore_spec_for_module(module=module, name=name, options=opts)
        if spec is not None and not isinstance(spec, KVCacheSpec):
            raise PluginValidationError(
                f"kvcore_spec_for_module returned {spec!r} for module {name!r}; "
                "expected a KVCacheSpec or None"
            )
        if spec is not None:
            self.check_registered(spec, f"the module hook, for module {name!r},")
        return spec

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
                f"unknown spec kind {kind!r}; {did_you_mean(kind, self._kinds)}registered kinds: {known}. "
                "A kind from a plugin "
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
            names = ["auto", *self._policies]
            raise UnknownPolicyError(
                f"unknown policy {name!r}; {did_you_mean(name, names)}choose one of {', '.join(names)}"
            ) from None

    def select(self, specs: Mapping[str, KVCacheSpec], name: str = "auto") -> PolicyChoice:
        """The policy to plan ``specs`` with, and why.

        ``"auto"`` asks the registered policies from the highest
        :attr:`~kvcore.AllocationPolicy.auto_priority` down (equal priorities in registration
        order; ``None`` never) and takes the first whose ``why_not`` is ``None``: with the
        built-ins, ``uniform`` when every layer has one spec, else ``shared_buffer``. Any other
        name must be a registered policy that can plan the specs.

        Args:
            specs: ``{layer name: spec}``.
            name: a policy name, or ``"auto"``.

        Returns:
            The choice: the policy, whether ``auto`` made it, and the reason.

        Raises:
            UnknownPolicyError: no such policy.
            PolicyNotApplicableError: the policy (for ``auto``: every policy it may pick)
                cannot plan these specs; says why.
            PluginValidationError: a policy declares an ``auto_priority`` that is not an int
                or ``None``.
        """
        if name != "auto":
            policy = self.policy(name)
            reason = policy.why_not(specs)
            if reason is not None:
                raise PolicyNotApplicableError(f"policy {name!r} cannot plan these layers: {reason}")
            return PolicyChoice(policy=policy, auto=False, reason="named")
        ranked: list[tuple[int, int, AllocationPolicy]] = []
        for index, entry in enumerate(self._policies.values()):
            priority = getattr(entry.obj, "auto_priority", None)
            if priority is None:
                continue
            if not is_int(priority):
                raise PluginValidationError(
                    f"policy {entry.name!r} from {entry.origin.describe()}: auto_priority must be an int "
                    f"or None (got {priority!r})"
                )
            ranked.append((-priority, index, entry.obj))
        passed_over: list[tuple[str, str]] = []
        for _, _, policy in sorted(ranked, key=lambda item: item[:2]):
            reason = policy.why_not(specs)
            if reason is None:
                distinct = len(specs_by_group_key(specs))
                seen = (
                    "every layer has the same spec"
                    if distinct <= 1
                    else f"the layers have {distinct} different specs"
                )
                return PolicyChoice(policy=policy, auto=True, reason=seen, passed_over=tuple(passed_over))
            passed_over.append((policy.name, reason))
        raise PolicyNotApplicableError(
            "no registered policy can plan these layers ("
            + "; ".join([f"{n}: {r}" for n, r in passed_over] or ["none that auto may pick is registered"])
            + ")"
        )

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


def _check_0_1_policy(policy: object, where: str) -> None:
    """Refuse a policy written against kvcore 0.1, naming what changed.

    0.1's ``layout(groups, num_blocks)`` placed regions for a block count, which a 0.2
    :class:`~kvcore.policy.BlockPlacement` (one block's row) cannot express. 0.1 policies had no
    ``auto_priority``; 0.2 registered them never picked by ``auto``, with a warning, and 0.3
    refuses them.

    Raises:
        PluginValidationError: either 0.1 form (the message says what to write instead).
    """
    layout = getattr(policy, "layout", None)
    if callable(layout):
        try:
            parameters = list(inspect.signature(layout).parameters)
        except (TypeError, ValueError):  # a builtin or C callable: nothing to read
            parameters = []
        if "num_blocks" in parameters:
            raise PluginValidationError(
                f"{where}: policy {getattr(policy, 'name', policy)!r} implements kvcore 0.1's "
                "layout(groups, num_blocks) -> Layout; since kvcore 0.2 layout(groups) returns a "
                "kvcore.BlockPlacement describing one block id's row (offsets and page strides), and "
                "kvcore sizes the tensors for the block count; see docs/how-to/write-a-policy.md"
            )
    if hasattr(policy, "name") and not hasattr(policy, "auto_priority"):
        raise PluginValidationError(
            f"{where}: policy {policy.name!r} has no auto_priority (a kvcore 0.1 policy, refused "
            "since kvcore 0.3): declare auto_priority = None ('auto' never picks it) or an int on "
            "the policy"
        )


def _describe_family(entry: Registered) -> str:
    """``family 'llama' from builtin kvcore.plugins.models.attention_only``."""
    return f"family {entry.name!r} from {entry.origin.describe()}"


def _add_once(table: dict[str, Registered], what: str, entry: Registered) -> None:
    """Add ``entry`` to ``table`` under its name; a name two plugins register is refused.

    Args:
        table: the registry's table of spec kinds, policies or scheduler profiles.
        what: what the table holds, for the message (``"spec kind"``, ``"policy"``).
        entry: the new registration.

    Raises:
        DuplicateRegistrationError: ``table`` already holds the name, naming both plugins.
    """
    first = table.get(entry.name)
    if first is not None:
        raise DuplicateRegistrationError(
            f"{what} {entry.name!r} is registered twice: by {first.describe()} and by "
            f"{entry.describe()}; uninstall or block one of the two plugins"
        )
    table[entry.name] = entry
