"""What kvcore accepts: the largest sizes, lengths and layer counts, and the layer-name rule.

Inputs beyond these limits are refused where they are read, with the value, the limit and the
fix (:class:`~kvcore.errors.InvalidInputError`, :class:`~kvcore.errors.InvalidSpecError` or
:class:`~kvcore.errors.ModelConfigError`), before anything is built: no real model comes near
them, and past them arithmetic that is exact on paper turns into minutes of work, gigabytes of
memory, or floats that overflow. They are documented in ``docs/reference/cli.md`` ("Limits").

Layer names are checked when they are read (spec files, model configs, module scans and the
Python entry points) by :func:`check_layer_name`, the same rule binding relies on: a layer name
is a qualified module name as ``torch.nn.Module.named_modules()`` gives them, so that a stand-in
module tree (``kvcore allocate --specs``) can be built for any accepted name.

This module is part of the contract: of kvcore it imports :mod:`kvcore.errors` only, and no torch.
"""

from __future__ import annotations

from kvcore.errors import InvalidInputError, InvalidSpecError, KVCoreError

#: The largest byte size kvcore accepts (a KV-cache budget, ``--memory``): 1 EiB (2**60 bytes),
#: a million times the memory of today's largest accelerators.
MAX_BYTES = 2**60

#: The largest ``max_model_len`` (and ``max_num_batched_tokens``) kvcore accepts: 2**32 tokens,
#: about 400 times the longest context a published model states (10M tokens).
MAX_TOKENS = 2**32

#: The most cache-holding layers one model may have, checked before any spec is built
#: (``num_hidden_layers`` of a config, the layers of a spec file, a module scan, the specs given
#: to the planner): 100,000, about 1,000 times a large model's layer count.
MAX_LAYERS = 100_000

#: The most bytes kvcore reads from one input file (a spec file, a ``config.json``, a saved plan,
#: a trace): 256 MiB, about 30 times a plan of 100,000 layers (7.6 MB) and 4 times a trace of a
#: million requests. Files are read at most this plus one byte, so a device that never ends
#: (``/dev/zero``) is refused after that many bytes instead of filling memory. A Python caller
#: may lower or raise it by assigning ``kvcore.limits.MAX_INPUT_BYTES`` (read at each call).
MAX_INPUT_BYTES = 2**28

#: The deepest nesting of JSON arrays and objects kvcore reads: 64 levels. Its own formats nest
#: at most 7 deep (a plan's pools, groups, specs, state parts and shapes); past a few hundred,
#: Python's JSON reader and every walk of the result run out of stack (``RecursionError``).
MAX_JSON_DEPTH = 64

#: Names a part of a layer name may not take: the attributes every ``torch.nn.Module`` has
#: (``to``, ``training``, ``forward``, ``_modules``, ...), which ``add_module`` refuses, and
#: ``kv_cache``, the attribute binding sets, and ``smart_apply``, which transformers adds to every
#: module when it is imported (dunder names such as ``__init__`` are refused too).
#: Kept torch-free here; a runtime test checks it covers ``dir(torch.nn.Module())``.
RESERVED_NAME_PARTS: frozenset[str] = frozenset(
    {
        "T_destination", "_apply", "_backward_hooks", "_backward_pre_hooks", "_buffers",
        "_call_impl", "_compiled_call_impl", "_forward_hooks", "_forward_hooks_always_called",
        "_forward_hooks_with_kwargs", "_forward_pre_hooks", "_forward_pre_hooks_with_kwargs",
        "_get_backward_hooks", "_get_backward_pre_hooks", "_get_name", "_is_full_backward_hook",
        "_load_from_state_dict", "_load_state_dict_post_hooks", "_load_state_dict_pre_hooks",
        "_maybe_warn_non_full_backward_hook", "_modules", "_named_members",
        "_non_persistent_buffers_set", "_parameters", "_register_load_state_dict_pre_hook",
        "_register_state_dict_hook", "_replicate_for_data_parallel", "_save_to_state_dict",
        "_slow_forward", "_state_dict_hooks", "_state_dict_pre_hooks", "_version",
        "_wrapped_call_impl", "add_module", "apply", "bfloat16", "buffers", "call_super_init",
        "children", "compile", "cpu", "cuda", "double", "dump_patches", "eval", "extra_repr",
        "float", "forward", "get_buffer", "get_extra_state", "get_parameter", "get_submodule",
        "half", "ipu", "load_state_dict", "modules", "mtia", "named_buffers", "named_children",
        "named_modules", "named_parameters", "parameters", "register_backward_hook",
        "register_buffer", "register_forward_hook", "register_forward_pre_hook",
        "register_full_backward_hook", "register_full_backward_pre_hook",
        "register_load_state_dict_post_hook", "register_load_state_dict_pre_hook",
        "register_module", "register_parameter", "register_state_dict_post_hook",
        "register_state_dict_pre_hook", "requires_grad_", "set_extra_state", "set_submodule",
        "share_memory", "state_dict", "to", "to_empty", "train", "training", "type", "xpu",
        "zero_grad", "kv_cache",
        "smart_apply",
    }
)  # fmt: skip


def shown(value: int) -> str:
    """``value`` as a message shows it: the digits, or ``a 401-digit number`` past 30 digits.

    Python refuses to turn ints of more than 4,300 digits into text, and a message full of
    digits helps no one.

    Args:
        value: an int.

    Returns:
        The text.
    """
    if value.bit_length() <= 96:  # at most 29 digits
        return str(value)
    digits = int(value.bit_length() * 0.30103) + 1  # within one of the true count
    return f"{'-' if value < 0 else ''}a number of about {digits} digits"


def check_at_most(
    value: int, limit: int, name: str, fix: str, error: type[KVCoreError] = InvalidInputError
) -> int:
    """Refuse ``value`` above ``limit``.

    Args:
        value: the value.
        limit: the largest allowed, one of this module's constants.
        name: what the message calls the value (``"'max_model_len'"``) and the constant, e.g.
            ``"'max_model_len' (kvcore.limits.MAX_TOKENS)"``.
        fix: what to do instead, ending the message.
        error: the error class to raise.

    Returns:
        ``value``.

    Raises:
        KVCoreError: an instance of ``error``: ``<name> must be at most <limit> (got <value>); <fix>``.
    """
    if value > limit:
        raise error(f"{name} must be at most {limit:,} (got {shown(value)}); {fix}")
    return value


def check_layer_name(name: object) -> str:
    """Check that ``name`` can name a layer: a qualified module name.

    The rule: a non-empty string whose dot-separated parts are non-empty (no ``a..b``, ``.a``
    or ``y.``), none of them an attribute every ``torch.nn.Module`` has (:data:`RESERVED_NAME_PARTS`,
    such as ``to``, ``training`` or ``forward``) or a dunder name: exactly the names
    ``torch.nn.Module.add_module`` accepts under a fresh module.

    Args:
        name: the layer name.

    Returns:
        ``name``, typed as a string.

    Raises:
        InvalidSpecError: naming the layer and what is wrong with it.
    """
    if not isinstance(name, str) or not name:
        raise InvalidSpecError(f"layer names must be non-empty strings (got {name!r})")
    parts = name.split(".")
    if "" in parts:
        raise InvalidSpecError(
            f"layer name {name!r} has an empty part between dots; layer names are qualified module "
            "names such as 'model.layers.0.self_attn'"
        )
    for part in parts:
        if part in _ALLOWED_PARTS:  # models repeat their parts ("model", "layers", "self_attn")
            continue
        if part in RESERVED_NAME_PARTS or (part.startswith("__") and part.endswith("__")):
            raise InvalidSpecError(
                f"layer name {name!r} has the part {part!r}, a name that torch.nn.Module (or binding, "
                "for kv_cache) reserves, so no submodule can have it; rename the layer, e.g. "
                "'model.layers.0.self_attn'"
            )
        if len(_ALLOWED_PARTS) < _ALLOWED_PARTS_KEPT:
            _ALLOWED_PARTS.add(part)
    return name


#: Name parts already found allowed, so that checking 10,000 layer names costs a set lookup per
#: part; bounded, so that a stream of odd names cannot grow it without end.
_ALLOWED_PARTS: set[str] = set()
_ALLOWED_PARTS_KEPT = 200_000


def check_layer_count(count: int, source: str = "the model") -> None:
    """Refuse more than :data:`MAX_LAYERS` layers.

    Args:
        count: how many layers there are (or will be).
        source: what has them, for the message (``"spec file specs.json"``).

    Raises:
        InvalidSpecError: ``count`` is above :data:`MAX_LAYERS`.
    """
    if count > MAX_LAYERS:
        raise InvalidSpecError(
            f"{source} has {count} layers; kvcore plans at most {MAX_LAYERS:,} layers (kvcore.limits."
            "MAX_LAYERS): check the layer count"
        )
