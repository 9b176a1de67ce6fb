"""Options shared by the commands that plan, split by what they read:

- :mod:`~kvcore.cli.inputs.values`: one command-line value (counts, sizes, lists, dtypes);
- :mod:`~kvcore.cli.inputs.model`: the model or spec file the layers come from;
- :mod:`~kvcore.cli.inputs.sizing`: the memory, the request length and the grouping knobs, and
  the :class:`~kvcore.planning.request.PlanRequest` a command makes of them;
- :mod:`~kvcore.cli.inputs.trace`: the workload a simulating command replays;
- :mod:`~kvcore.cli.inputs.flag_names`: how errors name the options.

The commands read them through this package (``inputs.sizing_context(args)``).
"""

from __future__ import annotations

from kvcore.cli.inputs.flag_names import (
    FLAG_NAMES,
)
from kvcore.cli.inputs.model import (
    add_pipeline_option,
    add_revision_option,
    add_spec_source,
    load_layer_specs,
    load_model,
    model_options,
    parallelism,
    settle_max_model_len,
)
from kvcore.cli.inputs.sizing import (
    add_gpu_options,
    add_grouping_options,
    add_planning_options,
    add_sizing_options,
    length_cap,
    length_cap_name,
    options_report,
    plan_options,
    plan_request,
    policy_rows,
    settle_auto_length,
    sizing_context,
)
from kvcore.cli.inputs.trace import (
    SYNTHETIC_OPTIONS,
    add_workload_options,
    load_workload,
    refuse_engine_options,
    synthetic_options,
    wants_workload,
)
from kvcore.cli.inputs.values import (
    Echoed,
    block_counts,
    comma_list,
    dtype_names,
    echo_given,
    fraction,
    length_dist,
    max_model_len,
    names,
    number,
    pool_fractions,
    positive_int,
    positive_ints,
    rate,
    retention_interval,
    revision,
    seed,
    share,
    size,
    state_cache_modes,
    token_count,
    token_counts,
    tokens,
    utilization,
)

__all__ = [
    "FLAG_NAMES",
    "SYNTHETIC_OPTIONS",
    "Echoed",
    "add_gpu_options",
    "add_grouping_options",
    "add_pipeline_option",
    "add_planning_options",
    "add_revision_option",
    "add_sizing_options",
    "add_spec_source",
    "add_workload_options",
    "block_counts",
    "comma_list",
    "dtype_names",
    "echo_given",
    "fraction",
    "length_cap",
    "length_cap_name",
    "length_dist",
    "load_layer_specs",
    "load_model",
    "load_workload",
    "max_model_len",
    "model_options",
    "names",
    "number",
    "options_report",
    "parallelism",
    "plan_options",
    "plan_request",
    "policy_rows",
    "pool_fractions",
    "positive_int",
    "positive_ints",
    "rate",
    "refuse_engine_options",
    "retention_interval",
    "revision",
    "seed",
    "settle_auto_length",
    "settle_max_model_len",
    "share",
    "size",
    "sizing_context",
    "state_cache_modes",
    "synthetic_options",
    "token_count",
    "token_counts",
    "tokens",
    "utilization",
    "wants_workload",
]
