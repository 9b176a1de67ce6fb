"""JSON for specs and plans, through a cattrs converter built from a registry.

Spec classes never import cattrs ("validation belongs to the edges"). The converter is built
*after* every plugin is loaded, because a tagged union only knows the kinds registered when it
is made; :func:`converter_for` does that.

Formats (documented in ``docs/reference/json-formats.md``):

- a spec: ``{"kind": "full_attention", "block_size": 16, "num_kv_heads": 8, ...}``;
- a group: ``{"layers": [...], "blocks_per_page": 1, "page_size_bytes": ..., <the spec>}``;
- a plan: the attrs fields of :class:`~kvcore.plan.KVCachePlan`, groups as above; an offload
  tier as ``"offload_tier": {"pool_bytes": [...]}`` (left out when there is none).
"""

from __future__ import annotations

import json
import sys
import weakref
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import attrs
import cattrs
from cattrs.gen import make_dict_structure_fn, make_dict_unstructure_fn, override
from cattrs.v import format_exception

from kvcore.dtypes import DType, dtype_name, to_dtype
from kvcore.errors import InvalidInputError, InvalidSpecError, KVCoreError, PlanValidationError
from kvcore.json_input import loads
from kvcore.plan import KVCacheGroup, KVCachePlan
from kvcore.planning.invariants import check_plan
from kvcore.spec import OMIT_IF_DEFAULT, KVCacheSpec, SizingContext
from kvcore.validators import is_int

if TYPE_CHECKING:
    from kvcore.planning.registry import Registry

#: Fields of a sizing context that JSON leaves out while they hold their defaults.
SERVING_FIELDS = ("num_speculative_tokens", "state_cache_mode", "max_encoder_tokens")

#: The abstract spec base as a plain type (mypy will not pass an abstract class as ``type[T]``).
_SPEC_BASE: Any = KVCacheSpec

#: Keys of a group object that are not fields of its spec (the last two are report figures,
#: ignored when reading).
GROUP_KEYS = (
    "layers",
    "blocks_per_page",
    "page_size_bytes",
    "pool",
    "layer_specs",
    "blocks_per_request",
    "tokens_held",
)


def _format_exception(exc: BaseException, type_: type | None) -> str:
    # cattrs words every ValueError "invalid value"; a validator's own sentence says more
    text = str(exc)
    if isinstance(exc, (ValueError, TypeError)) and not isinstance(exc, KeyError) and text:
        return text
    return format_exception(exc, type_)


def _error_text(exc: BaseException) -> str:
    # one line, whatever the input held: a key named "\n" is shown as such
    if isinstance(exc, cattrs.BaseValidationError):
        text = "; ".join(cattrs.transform_error(exc, format_exception=_format_exception))
    else:
        text = str(exc)
    return text.replace("\r", "\\r").replace("\n", "\\n")


def _plan_validation_errors(exc: BaseException) -> list[PlanValidationError]:
    """Every PlanValidationError inside a cattrs validation error (a plan that was built)."""
    if isinstance(exc, PlanValidationError):
        return [exc]
    return [found for inner in getattr(exc, "exceptions", ()) for found in _plan_validation_errors(inner)]


def _first_kvcore_error(exc: BaseException) -> KVCoreError | None:
    """The first KVCoreError inside a cattrs validation error (a spec validator's own message)."""
    if isinstance(exc, KVCoreError):
        return exc
    for inner in getattr(exc, "exceptions", ()):
        found = _first_kvcore_error(inner)
        if found is not None:
            return found
    return None


def _strict_int(value: Any, _: Any) -> int:
    # cattrs would call int() and accept "16" or 16.7; a spec file must say what it means.
    if not is_int(value):
        raise TypeError(f"expected an integer, got {value!r}")
    return value


def _strict_bool(value: Any, _: Any) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"expected true or false, got {value!r}")
    return value


def _is_torch_dtype_type(t: Any) -> bool:
    return getattr(t, "__module__", None) == "torch" and getattr(t, "__name__", None) == "dtype"


def _structure_torch_dtype(value: Any, _: Any) -> Any:
    return getattr(sys.modules["torch"], to_dtype(value).name)


def make_converter(registry: Registry) -> cattrs.Converter:
    """A converter that (un)structures every kind in ``registry``, groups and plans.

    Unknown keys in a spec are an error (a typo in an optional field must not pass silently);
    unknown keys in a plan are ignored, so a report with extra figures reads back as a plan.
    """
    # Unknown keys are an error at every level (a typo must not pass silently), except at the
    # top of a plan, which may carry report figures (kvcore.cli.report.plan_report).
    conv = cattrs.Converter(forbid_extra_keys=True)
    conv.register_structure_hook(int, _strict_int)
    conv.register_structure_hook(bool, _strict_bool)
    conv.register_unstructure_hook(DType, dtype_name)
    conv.register_structure_hook(DType, lambda value, _: to_dtype(value))
    # A third-party spec may still declare a field as torch.dtype; it reads and writes the same
    # names, and torch is already imported wherever such a class exists.
    conv.register_unstructure_hook_func(_is_torch_dtype_type, dtype_name)
    conv.register_structure_hook_func(_is_torch_dtype_type, _structure_torch_dtype)

    structure_spec = _register_specs(conv, registry)
    _register_groups(conv, structure_spec)
    _register_plans(conv)
    return conv


_StructureSpec = Callable[[Any, Any], KVCacheSpec]


def _register_specs(conv: cattrs.Converter, registry: Registry) -> _StructureSpec:
    """Specs of every kind in ``registry``, tagged by ``kind``; returns the structure function."""

    def is_spec_class(t: Any) -> bool:
        return isinstance(t, type) and issubclass(t, KVCacheSpec)

    def unstructure_spec_factory(cls: type[KVCacheSpec]) -> Any:
        # fields a kind gained later stay out of the JSON while they hold their default
        later: dict[str, Any] = {
            a.name: override(omit_if_default=True)
            for a in attrs.fields(cls)
            if a.metadata.get(OMIT_IF_DEFAULT)
        }
        base = make_dict_unstructure_fn(cls, conv, **later)

        def unstructure(spec: KVCacheSpec) -> dict[str, Any]:
            return {"kind": spec.kind, **base(spec)}

        return unstructure

    structure_fns: dict[type[KVCacheSpec], Any] = {}

    def structure_spec(data: Any, cls: type[KVCacheSpec]) -> KVCacheSpec:
        if not isinstance(data, Mapping):
            raise InvalidSpecError(f"a spec must be a JSON object (got {type(data).__name__} {data!r})")
        kind = data.get("kind")
        if not isinstance(kind, str):
            raise InvalidSpecError(f"a spec needs a string 'kind' (got {kind!r})")
        target = registry.spec_class(kind)
        if cls is not KVCacheSpec and not issubclass(target, cls):
            raise InvalidSpecError(f"expected a {cls.__name__} but the spec's kind is {kind!r}")
        fn = structure_fns.get(target)
        if fn is None:
            fn = make_dict_structure_fn(target, conv, _cattrs_forbid_extra_keys=True)
            structure_fns[target] = fn
        fields = {k: v for k, v in data.items() if k != "kind"}
        try:
            return fn(fields, target)  # type: ignore[no-any-return]
        except KVCoreError:
            raise
        except (cattrs.BaseValidationError, TypeError, ValueError) as exc:
            inner = _first_kvcore_error(exc)
            if inner is not None:
                raise inner from None
            allowed = ", ".join(a.name for a in attrs.fields(target))
            raise InvalidSpecError(f"{kind}: {_error_text(exc)} (fields of {kind}: {allowed})") from None

    conv.register_unstructure_hook_factory(is_spec_class, unstructure_spec_factory)
    conv.register_structure_hook_func(is_spec_class, structure_spec)
    return structure_spec


def _register_groups(conv: cattrs.Converter, structure_spec: _StructureSpec) -> None:
    """Groups: their spec's fields inline, beside the layers, page size and pool."""

    def unstructure_group(group: KVCacheGroup) -> dict[str, Any]:
        out = {
            "layers": list(group.layer_names),
            **conv.unstructure(group.spec),
            "page_size_bytes": group.spec.page_size_bytes,
            "blocks_per_page": group.blocks_per_page,
        }
        if group.pool:
            out["pool"] = group.pool
        if group.layer_specs:
            out["layer_specs"] = {name: conv.unstructure(spec) for name, spec in group.layer_specs.items()}
        return out

    def structure_group(data: Any, _: Any) -> KVCacheGroup:
        if not isinstance(data, Mapping):
            raise InvalidInputError(f"a group must be a JSON object (got {data!r})")
        spec = structure_spec({k: v for k, v in data.items() if k not in GROUP_KEYS}, _SPEC_BASE)
        layer_specs = data.get("layer_specs", {})
        if not isinstance(layer_specs, Mapping):
            raise InvalidInputError(f"a group's 'layer_specs' must be a JSON object (got {layer_specs!r})")
        group = KVCacheGroup(
            layer_names=tuple(data.get("layers", ())),
            spec=spec,
            blocks_per_page=data.get("blocks_per_page", 1),
            pool=data.get("pool", 0),
            layer_specs={name: structure_spec(value, _SPEC_BASE) for name, value in layer_specs.items()},
        )
        stated = data.get("page_size_bytes")
        if stated is not None and stated != spec.page_size_bytes:
            raise PlanValidationError(
                [
                    f"group {list(group.layer_names)[:3]}... states page_size_bytes {stated} but its "
                    f"spec has {spec.page_size_bytes}"
                ]
            )
        return group

    conv.register_unstructure_hook(KVCacheGroup, unstructure_group)
    conv.register_structure_hook(KVCacheGroup, structure_group)


def _register_plans(conv: cattrs.Converter) -> None:
    """Plans (one-pool plans read and write their old form) and sizing contexts."""
    structure_plan_fields = make_dict_structure_fn(KVCachePlan, conv, _cattrs_forbid_extra_keys=False)

    def structure_plan(data: Any, cls: Any) -> KVCachePlan:
        # a one-pool plan says num_blocks and bytes_per_block, as it always did
        if isinstance(data, Mapping) and "pools" not in data:
            missing = [key for key in ("num_blocks", "bytes_per_block") if key not in data]
            if missing:
                raise InvalidInputError(
                    f"not a kvcore plan: it needs 'pools', or {' and '.join(repr(k) for k in missing)}"
                )
            pool = {"num_blocks": data["num_blocks"], "bytes_per_block": data["bytes_per_block"]}
            data = {**data, "pools": [pool]}
        elif isinstance(data, Mapping) and ("num_blocks" in data or "bytes_per_block" in data):
            raise InvalidInputError(
                "not a kvcore plan: a plan with 'pools' states each pool's num_blocks and bytes_per_block "
                "there, not at the top"
            )
        return structure_plan_fields(data, cls)

    conv.register_structure_hook(KVCachePlan, structure_plan)
    # a context without serving options (speculative tokens, state cache mode, encoder length)
    # reads and writes as it always did
    serving: dict[str, Any] = {name: override(omit_if_default=True) for name in SERVING_FIELDS}
    conv.register_unstructure_hook(
        SizingContext,
        make_dict_unstructure_fn(
            SizingContext,
            conv,
            **serving,
        ),
    )
    # a plan without KV-sharing layers reads and writes as it always did
    unstructure_plan_fields = make_dict_unstructure_fn(
        KVCachePlan,
        conv,
        kv_sharing=override(omit_if_default=True),
        null_block=override(omit_if_default=True),
        # a plan without a host tier reads and writes as it always did
        offload_tier=override(omit_if_default=True),
        # and so does a plan split by worst-case need
        pool_split=override(omit_if_default=True),
    )

    def unstructure_plan(plan: KVCachePlan) -> dict[str, Any]:
        data: dict[str, Any] = unstructure_plan_fields(plan)
        if len(plan.pools) > 1:
            return data
        # a one-pool plan reads and writes as it always did
        pool = plan.pools[0]
        out: dict[str, Any] = {}
        for key, value in data.items():
            if key == "pools":
                out["num_blocks"] = pool.num_blocks
                out["bytes_per_block"] = pool.bytes_per_block
            else:
                out[key] = value
        return out

    conv.register_unstructure_hook(KVCachePlan, unstructure_plan)


#: One converter per registry, rebuilt when the registry's kinds change. Held weakly, so a
#: registry that is dropped takes its converter with it. (The registry knows nothing of JSON.)
_CONVERTERS: weakref.WeakKeyDictionary[Registry, tuple[tuple[str, ...], cattrs.Converter]] = (
    weakref.WeakKeyDictionary()
)


def converter_for(registry: Registry) -> cattrs.Converter:
    """The JSON converter for ``registry``'s kinds, made once and reused.

    Args:
        registry: where the spec kinds (and so the ``kind`` tags) come from.

    Returns:
        :func:`make_converter`'s converter, cached until the registry's kinds change.
    """
    kinds = tuple(registry.kinds)
    cached = _CONVERTERS.get(registry)
    if cached is None or cached[0] != kinds:
        cached = (kinds, make_converter(registry))
        _CONVERTERS[registry] = cached
    return cached[1]


def spec_to_dict(spec: KVCacheSpec, registry: Registry) -> dict[str, Any]:
    """A spec as a JSON-ready dict with its ``kind`` tag."""
    return converter_for(registry).unstructure(spec)  # type: ignore[no-any-return]


def spec_from_dict(data: Mapping[str, Any], registry: Registry) -> KVCacheSpec:
    """Build a spec from its JSON dict (the ``kind`` key picks the class).

    Raises:
        UnknownSpecKindError: no plugin registered that kind.
        InvalidSpecError: a field is missing, unknown or invalid.
    """
    return converter_for(registry).structure(data, _SPEC_BASE)  # type: ignore[no-any-return]


def plan_to_dict(plan: KVCachePlan, registry: Registry) -> dict[str, Any]:
    """A plan as a JSON-ready dict (lossless: :func:`plan_from_dict` gives an equal plan)."""
    return converter_for(registry).unstructure(plan)  # type: ignore[no-any-return]


def plan_from_dict(
    data: Mapping[str, Any], registry: Registry, *, source: str | None = None, check: bool = True
) -> KVCachePlan:
    """Read a plan back from :func:`plan_to_dict` output (extra keys, such as the report
    figures of ``kvcore plan --json``, are ignored) and check it like any plan
    (:func:`kvcore.planning.invariants.check_plan`): a saved plan is an input.

    Args:
        data: the plan's JSON object.
        registry: the spec kinds the groups may name.
        source: where the plan came from (a file name), for messages.
        check: run the complete check (live-page overlap, budget); the structural rules are
            always checked, as for any plan that is built.

    Returns:
        The plan.

    Raises:
        InvalidInputError: a field is missing or mistyped; says which and why.
        PlanValidationError: the plan breaks an invariant; lists every problem, with the
            plan's policy and ``source``.
    """
    policy = data.get("policy") if isinstance(data, Mapping) else None
    name = policy if isinstance(policy, str) else None
    try:
        plan: KVCachePlan = converter_for(registry).structure(data, KVCachePlan)
    except PlanValidationError as exc:
        raise exc.about(policy=name, source=source) from None
    except KVCoreError:
        raise
    except (cattrs.BaseValidationError, TypeError, ValueError, KeyError) as exc:
        broken = _plan_validation_errors(exc)
        if broken:
            problems = [problem for error in broken for problem in error.problems]
            raise PlanValidationError(problems, policy=name, source=source) from None
        where = f" ({source})" if source is not None else ""
        text = _error_text(exc)
        if isinstance(data, Mapping) and "pools" not in data:
            # a one-pool plan's num_blocks and bytes_per_block are read as its one pool's
            text = text.replace("$.pools[0].", "$.")
        raise InvalidInputError(f"not a kvcore plan{where}: {text}") from None
    if check:
        check_plan(plan, source=source, structure=False)
    return plan


def plan_to_json(plan: KVCachePlan, registry: Registry, **dumps_kwargs: Any) -> str:
    """:func:`plan_to_dict` as a JSON string."""
    return json.dumps(plan_to_dict(plan, registry), **dumps_kwargs)


def plan_from_json(text: str, registry: Registry, *, source: str | None = None) -> KVCachePlan:
    """Read a plan from a JSON string (see :func:`plan_from_dict`).

    Args:
        text: the JSON.
        registry: the spec kinds the groups may name.
        source: where the text came from (a file name), for messages.

    Raises:
        InvalidInputError: not JSON, nested deeper than :data:`kvcore.limits.MAX_JSON_DEPTH`, a
            number of more than 4,300 digits, not an object, or not a plan.
        PlanValidationError: the plan breaks an invariant.
    """
    where = f" ({source})" if source is not None else ""
    try:
        data = loads(text, source or "the plan")
    except json.JSONDecodeError as exc:
        raise InvalidInputError(f"plan{where} is not valid JSON: {exc}") from None
    if not isinstance(data, Mapping):
        raise InvalidInputError(f"a plan must be a JSON object (got {type(data).__name__}){where}")
    return plan_from_dict(data, registry, source=source)
