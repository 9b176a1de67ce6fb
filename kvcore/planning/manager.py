"""The plugin-manager factory: built-ins, entry points and explicit plugins, in a fixed order.

There is no global plugin manager. :func:`get_plugin_manager` builds a fresh one each time; hold
the result (or the :class:`~kvcore.planning.registry.Registry` built from it) where you need it.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.metadata
import os
import sys
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from types import ModuleType

import attrs
import pluggy

from kvcore import hookspecs
from kvcore.error_messages import did_you_mean
from kvcore.errors import (
    InvalidInputError,
    KVCoreError,
    PluginFailedWarning,
    PluginLoadError,
    PluginValidationError,
)

#: Built-in plugin modules, registered under these names exactly like third-party plugins.
#: Any of them can be blocked by name (``block=`` or ``KVCORE_BLOCK_PLUGINS``).
BUILTIN_PLUGINS: tuple[str, ...] = (
    "kvcore.plugins.attention",
    "kvcore.plugins.full_attention",
    "kvcore.plugins.sliding_window",
    "kvcore.plugins.chunked_local_attention",
    "kvcore.plugins.mla",
    "kvcore.plugins.dsa_indexer",
    "kvcore.plugins.compressed_mla",
    "kvcore.plugins.compressed_indexer",
    "kvcore.plugins.sliding_window_mla",
    "kvcore.plugins.state",
    "kvcore.plugins.cross_attention",
    # model families (kvcore_register_model_families), the module front end, the generic fallback
    "kvcore.plugins.models.attention_only",
    "kvcore.plugins.models.llama4",
    "kvcore.plugins.models.deepseek",
    "kvcore.plugins.models.jamba",
    "kvcore.plugins.models.nemotron_h",
    "kvcore.plugins.models.mamba",
    "kvcore.plugins.models.qwen3_next",
    "kvcore.plugins.models.gemma4",
    "kvcore.plugins.models.gemma3n",
    "kvcore.plugins.models.kimi_linear",
    "kvcore.plugins.models.deepseek_v4",
    "kvcore.plugins.models.refused",
    "kvcore.plugins.models.whisper",
    "kvcore.plugins.models.mllama",
    "kvcore.plugins.transformers_modules",
    "kvcore.plugins.models.generic",
    # weights counted from configs (kvcore_count_parameters), for --gpu-memory
    "kvcore.plugins.models.parameters",
    "kvcore.policies.uniform",
    "kvcore.policies.shared_buffer",
    "kvcore.policies.equal_groups",
    "kvcore.policies.kind_pools",
    "kvcore.policies.unified_pool",
    # scheduler profiles (kvcore_register_scheduler_profiles): vllm, kvcore, sglang
    "kvcore.simulation.profiles",
)

#: Entry-point group third-party packages register plugins under.
ENTRY_POINT_GROUP = hookspecs.PROJECT_NAME

#: Environment switches read by :func:`get_plugin_manager`.
ENV_DISABLE_AUTOLOAD = "KVCORE_DISABLE_PLUGIN_AUTOLOAD"
ENV_BLOCK = "KVCORE_BLOCK_PLUGINS"
ENV_TRACE = "KVCORE_TRACE_PLUGINS"
ENV_STRICT = "KVCORE_STRICT_PLUGINS"

#: The plugin API this kvcore implements (docs/reference/plugin-api.md); a plugin that uses
#: names deprecated since an earlier one still loads, and is reported as written for that one.
PLUGIN_API_VERSION = "0.2"


@attrs.frozen(kw_only=True)
class PluginOrigin:
    """Where a registered plugin came from.

    Attributes:
        name: the name it is registered under.
        source: ``"builtin"``, ``"entry point"`` or ``"explicit"``.
        module: the plugin's module (or the type of a plugin object).
        distribution: the installed distribution that declared the entry point, if any.
        version: that distribution's version, if any.
    """

    name: str
    source: str
    module: str
    distribution: str | None = None
    version: str | None = None

    def describe(self) -> str:
        """``'acme-kv 1.2 (entry point acme)'`` or ``'builtin kvcore.plugins.mla'``."""
        if self.distribution:
            return f"{self.distribution} {self.version or ''} ({self.source} {self.name})".replace("  ", " ")
        return f"{self.source} {self.name}"


@attrs.frozen(kw_only=True)
class PluginFailure:
    """A third-party plugin that failed to load and was skipped (non-strict loading).

    Attributes:
        origin: where the plugin came from.
        stage: what failed: ``"import"`` (the entry point's module), ``"hooks"`` (a hook
            implementation kvcore does not have or with a wrong signature) or ``"registration"``
            (a registration hook raised or registered something invalid).
        error: the message strict loading raises.
    """

    origin: PluginOrigin
    stage: str
    error: str

    @property
    def remedy(self) -> str:
        """How to silence it: fix or uninstall the distribution, or block the plugin by name."""
        owner = f"uninstall {self.origin.distribution}" if self.origin.distribution else "remove it"
        return f"fix it or {owner}, or skip it with {ENV_BLOCK}={self.origin.name}"


class KVCorePluginManager(pluggy.PluginManager):
    """A pluggy manager for the ``kvcore`` project that remembers where each plugin came from.

    Attributes:
        origins: each registered plugin's origin, by name.
        strict: whether a third-party plugin that fails to load raises (``True``) or is
            skipped with a :class:`~kvcore.errors.PluginFailedWarning` and recorded in
            :attr:`failures`.
        failures: the plugins skipped so far, in the order they failed.
    """

    def __init__(self, *, strict: bool = True) -> None:
        super().__init__(hookspecs.PROJECT_NAME)
        self.origins: dict[str, PluginOrigin] = {}
        self.strict = strict
        self.failures: list[PluginFailure] = []
        #: what each plugin did that an earlier plugin API allowed and this one deprecates
        #: (the DeprecationWarnings raised while it was imported or registered), by plugin name
        self.deprecations: dict[str, list[str]] = {}

    @contextlib.contextmanager
    def noting_deprecations(self, name: str) -> Iterator[None]:
        """Record the deprecation warnings raised inside under plugin ``name`` (see
        :attr:`deprecations`), and let every warning through as Python would show it."""
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", DeprecationWarning)
            yield
        for w in caught:
            if issubclass(w.category, DeprecationWarning):
                notes = self.deprecations.setdefault(name, [])
                if str(w.message) not in notes:
                    notes.append(str(w.message))
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)

    def api_version(self, name: str) -> str:
        """The plugin API plugin ``name`` was written for, as far as loading it tells: the
        current one, or the earliest whose deprecated names it used."""
        return "0.1" if self.deprecations.get(name) else PLUGIN_API_VERSION

    def skip_or_raise(self, origin: PluginOrigin, stage: str, error: KVCoreError) -> None:
        """Handle a third-party plugin that failed: raise ``error`` when strict (or when the
        plugin is kvcore's own or passed explicitly), else unregister it, record the failure
        and warn once, so the rest of the registry still loads.

        Raises:
            KVCoreError: ``error`` itself, chained as it was.
        """
        if self.strict or origin.source != "entry point":
            raise error
        if self.has_plugin(origin.name):
            self.unregister(name=origin.name)
        self.origins.pop(origin.name, None)
        # block the name so a later load of the same entry points does not bring it back
        self.set_blocked(origin.name)
        failure = PluginFailure(origin=origin, stage=stage, error=str(error))
        self.failures.append(failure)
        warnings.warn(f"{error}; skipped it ({ENV_STRICT}=1 makes this an error)", PluginFailedWarning, 3)

    def register_plugin(self, plugin: object, name: str, origin: PluginOrigin) -> None:
        """Register ``plugin`` under ``name`` and record its origin.

        Raises:
            PluginValidationError: the plugin implements a hook with a wrong signature.
        """
        try:
            self.register(plugin, name=name)
        except pluggy.PluginValidationError as exc:
            raise PluginValidationError(
                f"plugin {origin.describe()}: {exc}; fix the hook, or skip the plugin with {ENV_BLOCK}={name}"
            ) from exc
        except ValueError as exc:  # pluggy: name or object already registered
            raise PluginLoadError(f"plugin {origin.describe()} cannot be registered: {exc}") from exc
        self.origins[name] = origin

    def origin_of(self, plugin: object) -> PluginOrigin:
        """The origin of a registered plugin object."""
        name = self.get_name(plugin)
        if name is not None and name in self.origins:
            return self.origins[name]
        return PluginOrigin(name=name or repr(plugin), source="unknown", module=_module_of(plugin))


def _module_of(plugin: object) -> str:
    if isinstance(plugin, ModuleType):
        return plugin.__name__
    return f"{type(plugin).__module__}:{type(plugin).__qualname__}"


def _env_list(name: str) -> list[str]:
    return [item.strip() for item in os.environ.get(name, "").split(",") if item.strip()]


def _env_flag(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() not in ("", "0", "false", "no")


def _short(value: object, limit: int = 160) -> str:
    text = f"<{type(value).__name__}>" if callable(value) and not isinstance(value, type) else repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def trace_hook_calls(
    pm: pluggy.PluginManager, write: Callable[[str], object] | None = None
) -> Callable[[], None]:
    """Report every hook call: its arguments, the plugins it reaches (in call order), its result.

    Each call writes two lines, ``kvcore trace: HOOK(ARGS) -> PLUGIN, PLUGIN`` and
    ``kvcore trace: HOOK returned RESULT`` (or ``raised ERROR``). For a first-result hook the
    first plugin in the list whose answer is not ``None`` wins.

    Args:
        pm: the plugin manager to watch.
        write: where the lines go (default: whatever ``sys.stderr`` is at the time of the call).

    Returns:
        A function that stops the tracing.
    """

    def out(line: str) -> None:
        (write or sys.stderr.write)(f"kvcore trace: {line}\n")

    def before(hook_name: str, hook_impls: Sequence[pluggy.HookImpl], kwargs: Mapping[str, object]) -> None:
        plugins = ", ".join(impl.plugin_name for impl in reversed(hook_impls)) or "no plugin"
        args = ", ".join(f"{key}={_short(value)}" for key, value in kwargs.items())
        out(f"{hook_name}({args}) -> {plugins}")

    def after(
        outcome: pluggy.Result[object],
        hook_name: str,
        hook_impls: Sequence[pluggy.HookImpl],
        kwargs: Mapping[str, object],
    ) -> None:
        if outcome.exception is not None:
            out(f"{hook_name} raised {type(outcome.exception).__name__}: {outcome.exception}")
        else:
            out(f"{hook_name} returned {_short(outcome.get_result())}")

    return pm.add_hookcall_monitoring(before, after)


def get_plugin_manager(
    *,
    autoload: bool | None = None,
    plugins: Iterable[object] = (),
    block: Iterable[str] = (),
    trace: bool | None = None,
    strict: bool | None = None,
) -> KVCorePluginManager:
    """Build a plugin manager with kvcore's hooks and plugins, in this order:

    1. create the manager and add :mod:`kvcore.hookspecs`;
    2. block the names in ``block`` and in ``$KVCORE_BLOCK_PLUGINS`` (comma-separated);
    3. register the built-ins (:data:`BUILTIN_PLUGINS`) that are not blocked;
    4. load the entry points of group ``kvcore`` unless autoloading is off;
    5. register ``plugins`` (modules or objects), named after their module or class;
    6. check that every hook implementation matches a hook.

    Args:
        autoload: load entry points; default: yes unless ``$KVCORE_DISABLE_PLUGIN_AUTOLOAD``
            is set.
        plugins: extra plugins to register explicitly.
        block: plugin names (built-in or entry-point names) not to register.
        trace: print every hook call to stderr; default: ``$KVCORE_TRACE_PLUGINS``.
        strict: raise when an entry-point plugin fails to import or register; default: no
            unless ``$KVCORE_STRICT_PLUGINS`` is set. Not strict, such a plugin is skipped with a
            :class:`~kvcore.errors.PluginFailedWarning` and listed in the manager's
            ``failures`` (``kvcore plugins --check``), and everything else still loads.
            Built-in and explicit plugins always raise.

    Raises:
        PluginLoadError: an entry point failed to import (strict only); the message names it
            and its distribution, and the original error is chained.
        InvalidInputError: a name to block is no plugin's (the message lists the known names).
        PluginValidationError: a plugin implements a hook wrongly (an entry point: strict only).
    """
    pm = KVCorePluginManager(strict=strict if strict is not None else _env_flag(ENV_STRICT))
    pm.add_hookspecs(hookspecs)
    plugins = list(plugins)
    blocked = {**dict.fromkeys(block, "block"), **dict.fromkeys(_env_list(ENV_BLOCK), ENV_BLOCK)}
    _check_blocked_names(blocked, plugins, group=ENTRY_POINT_GROUP)
    for name in blocked:
        pm.set_blocked(name)
    if trace if trace is not None else _env_flag(ENV_TRACE):
        trace_hook_calls(pm)

    for modname in BUILTIN_PLUGINS:
        if pm.is_blocked(modname):
            continue
        module = importlib.import_module(modname)
        pm.register_plugin(module, modname, PluginOrigin(name=modname, source="builtin", module=modname))

    if autoload if autoload is not None else not _env_flag(ENV_DISABLE_AUTOLOAD):
        load_entry_points(pm)

    for plugin in plugins:
        name = _plugin_name(plugin)
        if pm.is_blocked(name):
            continue
        pm.register_plugin(
            plugin, name, PluginOrigin(name=name, source="explicit", module=_module_of(plugin))
        )

    _check_hooks(pm)
    return pm


def _check_hooks(pm: KVCorePluginManager) -> None:
    """Refuse (or, not strict, skip) each plugin that implements a hook kvcore does not have."""
    while True:
        try:
            pm.check_pending()
            return
        except pluggy.PluginValidationError as exc:
            origin = pm.origin_of(exc.plugin)
            error = PluginValidationError(
                f"plugin {origin.describe()} implements a hook kvcore does not have: {exc}; "
                "check the spelling against kvcore.hookspecs, or skip the plugin with "
                f"{ENV_BLOCK}={origin.name}"
            )
            error.__cause__ = exc
            pm.skip_or_raise(origin, "hooks", error)


def _plugin_name(plugin: object) -> str:
    return plugin.__name__ if isinstance(plugin, ModuleType) else _module_of(plugin)


def _check_blocked_names(blocked: Mapping[str, str], plugins: Sequence[object], *, group: str) -> None:
    """Refuse a name to block that no plugin has: a misspelt name would block nothing silently."""
    known = {
        *BUILTIN_PLUGINS,
        *(ep.name for ep in importlib.metadata.entry_points(group=group)),
        *(_plugin_name(plugin) for plugin in plugins),
    }
    unknown = [name for name in blocked if name not in known]
    if unknown:
        from_env = [name for name in unknown if blocked[name] == ENV_BLOCK]
        where = f" (named in ${ENV_BLOCK})" if from_env and len(from_env) == len(unknown) else ""
        close = "".join(did_you_mean(name, known) for name in unknown)
        raise InvalidInputError(
            f"cannot block {', '.join(map(repr, unknown))}{where}: no plugin has that name; {close}known "
            f"plugins: {', '.join(sorted(known))}"
        )


def load_entry_points(pm: KVCorePluginManager, group: str = ENTRY_POINT_GROUP) -> int:
    """Register every plugin declared under entry-point ``group``; return how many were loaded.

    Names that are already registered or blocked are skipped; so, unless ``pm`` is strict,
    is an entry point that fails to import or register (:meth:`KVCorePluginManager.skip_or_raise`).

    Raises:
        PluginLoadError: naming the entry point and its distribution (strict only).
    """
    loaded = 0
    for ep in importlib.metadata.entry_points(group=group):
        if pm.is_blocked(ep.name) or pm.has_plugin(ep.name):
            continue
        dist = getattr(ep, "dist", None)
        dist_name = dist.metadata["Name"] if dist is not None else None
        version = dist.version if dist is not None else None
        where = f"entry point '{ep.name} = {ep.value}'" + (
            f" of distribution {dist_name} {version}" if dist_name else ""
        )
        origin = PluginOrigin(
            name=ep.name, source="entry point", module=ep.value, distribution=dist_name, version=version
        )
        try:
            with pm.noting_deprecations(ep.name):
                plugin = ep.load()
        except Exception as exc:  # any import-time failure of third-party code
            error = PluginLoadError(
                f"kvcore plugin {ep.name!r} ({where}) failed to import: "
                f"{type(exc).__name__}: {exc}; fix or uninstall it, or skip it with "
                f"{ENV_BLOCK}={ep.name}"
            )
            error.__cause__ = exc
            pm.skip_or_raise(origin, "import", error)
            continue
        try:
            pm.register_plugin(plugin, ep.name, origin)
        except KVCoreError as exc:
            pm.skip_or_raise(origin, "hooks", exc)
            continue
        loaded += 1
    return loaded
