"""How error messages name the settings to change on the command line."""

from __future__ import annotations

from kvcore.error_messages import ParameterNames

#: How error messages name the settings to change on the command line: the options below
#: (``lower --max-model-len to 8192``, ``--num-blocks 16 holds ...``) instead of the Python
#: parameters (:data:`~kvcore.error_messages.PYTHON_NAMES`). ``utilization`` stays a word: only
#: ``kvcore allocate`` has the option.
FLAG_NAMES = ParameterNames(
    max_model_len="--max-model-len",
    num_blocks="--num-blocks",
    memory="--memory",
    utilization="utilization",
    assign="{name} {value}",
    max_groups="--max-groups",
)
