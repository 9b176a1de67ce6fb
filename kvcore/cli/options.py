"""The options of the planning commands (``plan``, ``compare``, ``simulate``, ``allocate``), read
once from argparse into one typed value (:class:`PlanningArgs`), and the model config they name,
loaded once per command (:class:`LoadedModel`).

argparse gives each command only the options it adds; :meth:`PlanningArgs.read` fills the rest
with the value that means "not given", so every helper reads typed fields and no helper asks
whether an option exists. What a command settles as it runs (the length ``--max-model-len``
defaults to, the budget ``--gpu-memory`` gives) goes into a new value
(:func:`attrs.evolve`), never back into the options.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Literal

import attrs

from kvcore.errors import InvalidInputError
from kvcore.frontends.hf_config import ModelConfig, ModelLength
from kvcore.policy import PlanOptions
from kvcore.spec import DEFAULT_MAX_NUM_BATCHED_TOKENS

if TYPE_CHECKING:  # the simulation layer loads only for the commands that simulate
    from kvcore.simulation.workload import LengthDist

_DEFAULTS = PlanOptions()


@attrs.frozen(kw_only=True)
class LoadedModel:
    """The config ``--model`` names, read once for the whole command.

    Attributes:
        name: ``--model`` as given.
        config: the parsed ``config.json``.
        source: where it came from, for messages (``'bundled google/gemma-3-27b-it'``).
        length: the longest context it was trained for (``None`` where neither the config nor
            its family says).
        found: the lookup's answer (where it came from: a path, the zoo, the cache, the Hub),
            which reads the checkpoint's weights where ``--gpu-memory`` needs them.
    """

    name: str
    config: Mapping[str, Any]
    source: str
    length: ModelLength | None
    found: ModelConfig | None = None


@attrs.frozen(kw_only=True)
class PlanningArgs:
    """Every option of the planning commands, typed; an option a command does not take holds
    its "not given" value. Field names are the argparse destinations (``--max-model-len`` is
    ``max_model_len``).

    Besides the options, ``model_config`` holds the loaded ``--model`` (:func:`kvcore.cli.inputs.load_model`).
    """

    command: str
    # where the specs come from, and the model options
    model: str | None = None
    specs: str | None = None
    plan: str | None = None
    revision: str | None = None
    tp: int | None = None
    pp: int | None = None
    kv_cache_dtype: str | None = None
    state_dtype: str | None = None
    speculative: str | None = None
    block_size: int | None = None
    # the budget and the request length
    memory: int | None = None
    gpu_memory: int | None = None
    utilization: float | None = None
    max_model_len: int | Literal["auto"] | None = None
    max_num_batched_tokens: int = DEFAULT_MAX_NUM_BATCHED_TOKENS
    num_speculative_tokens: int = 0
    state_cache_mode: str | None = None
    max_encoder_tokens: int = 0
    # the choices of a plan
    policy: str = "auto"
    num_blocks: int | tuple[int, ...] | None = None
    grouping_tolerance: float = _DEFAULTS.grouping_tolerance
    max_block_size: int = _DEFAULTS.max_block_size
    reserve_null_block: bool = False
    uniform_block_size: bool = False
    max_groups: int | None = None
    block_multiples: str = _DEFAULTS.block_multiples
    pool_split: tuple[float, ...] | None = None
    # the candidates of compare and simulate
    policies: list[str] | None = None
    block_sizes: list[int] | None = None
    kv_cache_dtypes: list[str] | None = None
    state_cache_modes: list[str] | None = None
    engine: str = "kvcore"
    frontier: bool = False
    # a workload
    trace: str | None = None
    requests: int | None = None
    prompt_len: LengthDist | None = None
    output_len: LengthDist | None = None
    rate: float | None = None
    seed: int | None = None
    prefix_share: float | None = None
    prefix_len: int | None = None
    prefix_caching: bool = False
    # seconds on the steps
    gpu: str | None = None
    step_profile: str | None = None
    slo_ttft: float | None = None
    slo_itl: float | None = None
    # the scheduler profile (vLLM's settings: None where not given)
    scheduler: str | None = None
    async_scheduling: bool | None = None
    max_num_seqs: int | None = None
    reserve_full_isl: bool | None = None
    long_prefill_token_threshold: int | None = None
    prefix_cache_retention_interval: int | str | None = None  # "dense": vLLM's None
    # a host tier beside the device pool (plan)
    host_memory: int = 0
    # host tiers to simulate under each plan (simulate: one size, or a curve)
    host_memories: tuple[int, ...] = ()
    # allocate
    device: str = "cpu"
    no_zero: bool = False
    # output
    json: bool = False
    csv: bool = False
    map: str | None = None
    plot: str | None = None
    # not an option: the config --model names, loaded once (kvcore.cli.inputs.load_model)
    model_config: LoadedModel | None = None

    @classmethod
    def read(cls, args: argparse.Namespace) -> PlanningArgs:
        """The options argparse parsed, typed (the global options and ``run`` left out)."""
        given = vars(args)
        return cls(**{field.name: given[field.name] for field in attrs.fields(cls) if field.name in given})

    @property
    def kv_budget(self) -> int:
        """The KV-cache budget in bytes: ``--memory``, or what ``--gpu-memory`` settled it to
        (:func:`kvcore.cli.gpu.settle_budget`).

        Raises:
            InvalidInputError: neither was given (a command whose budget is optional).
        """
        if self.memory is None:
            raise InvalidInputError("give the KV-cache budget as --memory SIZE")
        return self.memory

    @property
    def tp_size(self) -> int:
        """``--tp`` (1 where not given)."""
        return self.tp or 1

    @property
    def pp_size(self) -> int:
        """``--pp`` (1 where not given)."""
        return self.pp or 1

    @property
    def model_length(self) -> ModelLength | None:
        """The loaded ``--model``'s trained length (``None`` for a spec file or a model without one)."""
        return self.model_config.length if self.model_config is not None else None
