"""The exception hierarchy: every error kvcore raises derives from :class:`KVCoreError`.

Leaves also derive from the built-in exception a caller would expect (``ValueError`` for bad
values, ``LookupError`` for unknown names, ``ImportError`` for plugins that fail to import), so
code that already catches those keeps working. Messages name the offending object, state the
rule, show what was received, and end with the fix where there is one, in a Python caller's
terms (``lower max_model_len to 8192``, ``num_blocks=16``), never a command-line flag. Errors
whose fix is a setting carry every figure as an attribute, so :mod:`kvcore.error_messages` can
word the same error for the command line (``lower --max-model-len to 8192``).
"""

from __future__ import annotations

from typing import Literal


class KVCoreError(Exception):
    """Base class of every error raised by kvcore."""


class InvalidSpecError(KVCoreError, ValueError):
    """A KV-cache spec (or a spec file) has a missing, mistyped or out-of-range field."""


class InvalidInputError(KVCoreError, ValueError):
    """Input other than a spec is unusable: a size string, a JSON file, an option value."""


class UnknownSpecKindError(KVCoreError, LookupError):
    """A spec names a ``kind`` that no registered plugin provides."""


class UnknownPolicyError(KVCoreError, LookupError):
    """A policy name that no registered plugin provides."""


class UnknownSchedulerError(KVCoreError, LookupError):
    """A scheduler profile name (``kvcore simulate --scheduler``) that no registered plugin provides."""


class DuplicateRegistrationError(KVCoreError, ValueError):
    """Two plugins registered the same spec kind or policy name, or claimed the same model type."""


class PluginLoadError(KVCoreError, ImportError):
    """A plugin (usually an entry point) failed to import or to register.

    The original exception is chained as ``__cause__`` so its traceback is kept.
    """


class PluginValidationError(KVCoreError, TypeError):
    """A plugin implements a hook wrongly or contributes an object of the wrong type."""


class KVCoreWarning(UserWarning):
    """Base class of kvcore's warnings: something ran, but the user should know a limit of it
    (the command line shows each as one ``kvcore: warning:`` line)."""


class SimulationWarning(KVCoreWarning):
    """A simulation runs, but a figure stands for less than the engine it models would do; the
    message says which, why, and how to plan so that it does not."""


class PluginFailedWarning(KVCoreWarning):
    """A third-party plugin failed to import or register and was skipped.

    Warned (not raised) so that one broken plugin package does not stop every user of the
    environment; the message is the :class:`PluginLoadError` or :class:`PluginValidationError`
    that strict loading (``strict=True`` or ``KVCORE_STRICT_PLUGINS=1``) would raise.
    """


class PolicyNotApplicableError(KVCoreError, ValueError):
    """The chosen allocation policy cannot plan these specs; the message says why."""


class GroupLimitError(PolicyNotApplicableError):
    """No layout of the policy has at most ``max_groups`` groups (``PlanOptions.max_groups``).

    Attributes:
        policy: the policy's name.
        max_groups: the bound asked for.
        smallest_groups: the fewest groups the policy can plan these layers in.
    """

    def __init__(self, message: str = "", *, policy: str, max_groups: int, smallest_groups: int) -> None:
        self.policy = policy
        self.max_groups = max_groups
        self.smallest_groups = smallest_groups
        super().__init__(message or f"policy {policy!r} needs at least {smallest_groups} groups")


class SpecMismatchError(KVCoreError, ValueError):
    """Specs that must agree do not (e.g. the same layer reported differently by two ranks)."""


class ModelConfigError(KVCoreError, ValueError):
    """A model's ``config.json`` lacks a field, has one out of range, or is not a JSON object.

    The message names the model type and the field (``text_config.num_key_value_heads``).
    """


class UnknownModelError(KVCoreError, LookupError):
    """No bundled model has that name, or no model-family plugin knows the config's model type."""


class ModelAccessError(KVCoreError, PermissionError):
    """The Hugging Face Hub refused a model's files (HTTP 401 / 403): the repository is gated or
    private. The message says to set ``HF_TOKEN`` and accept the licence on the model's page; it
    never holds the token."""


class HubUnavailableError(KVCoreError, ConnectionError):
    """The Hugging Face Hub (or the ``HF_ENDPOINT`` standing in for it) could not be reached, or
    answered with a server error; the message names the endpoint and says how to work offline."""


class MissingDependencyError(KVCoreError, ImportError):
    """An optional dependency is not installed: torch for allocation and the runtime
    (``kvcore[torch]``), huggingface_hub for models fetched from the Hub (``kvcore[hub]``).

    Attributes:
        extra: the extra that installs it (``"torch"``, ``"hub"``).
    """

    def __init__(self, message: str, *, extra: str) -> None:
        super().__init__(message)
        self.extra = extra


class StaleBuildError(KVCoreError, ImportError):
    """kvcore's compiled simulator modules (built with ``KVCORE_MYPYC=1``) were built from other
    sources than those beside them; the message names the changed sources and how to rebuild
    or delete the compiled modules (:mod:`kvcore.simulation.compiled`)."""


class UnknownGpuError(KVCoreError, LookupError):
    """The GPU catalogue (``kvcore/data/gpus.json``) has no GPU of that name; the message lists
    the names it has and the closest one."""


#: What did not fit, and so what an :class:`InsufficientMemoryError` suggests changing:
#: ``"memory"``: one request of ``max_model_len`` tokens needs more blocks than the memory holds
#: (lower ``max_model_len``, or give the KV cache more memory); ``"num_blocks"``: it needs more
#: blocks than a forced ``num_blocks`` (lower ``max_model_len``, or raise ``num_blocks``);
#: ``"forced_num_blocks"``: a forced ``num_blocks`` needs more bytes than the memory (lower
#: ``num_blocks``, or give the KV cache more memory).
ShortfallReason = Literal["memory", "num_blocks", "forced_num_blocks"]


class InsufficientMemoryError(KVCoreError, ValueError):
    """The KV cache cannot hold one request of ``max_model_len`` tokens, or a forced block count.

    The errors kvcore raises carry every figure of their message, and ``reason`` says which fix
    applies, so a caller can act on them (retry with ``largest_fitting_len``) and the command line
    can word the message with its flags (:func:`kvcore.error_messages.render`). kvcore builds
    them without a message and words it with :func:`kvcore.error_messages.with_message`.

    Attributes:
        reason: what did not fit (:data:`ShortfallReason`), or ``None`` where the raiser wrote
            its own message and gave only the first four figures.
        required_bytes: bytes needed: one request's, or the forced blocks'.
        available_bytes: bytes there are: the budget, or what the forced blocks hold.
        max_model_len: the request length asked for.
        largest_fitting_len: the largest ``max_model_len`` that fits (0 if not even one token,
            and for ``"forced_num_blocks"``, where no request was sized).
        required_blocks: block ids needed: by one request, or forced.
        available_blocks: block ids there are: that the budget holds, or forced.
        bytes_per_block: bytes of one block id, all groups together.
        where: the rank the figures are of, as the message starts (``"rank 2 (pp stage 1, tp
            rank 0) has the fewest blocks"``); empty for one worker.
        required_pool_blocks: ``required_blocks`` pool by pool, for a plan of several pools
            (``None`` otherwise).
        available_pool_blocks: ``available_blocks`` pool by pool, for a plan of several pools
            (``None`` otherwise).
    """

    def __init__(
        self,
        message: str = "",
        *,
        required_bytes: int,
        available_bytes: int,
        max_model_len: int,
        largest_fitting_len: int,
        reason: ShortfallReason | None = None,
        required_blocks: int | None = None,
        available_blocks: int | None = None,
        bytes_per_block: int | None = None,
        where: str = "",
        required_pool_blocks: tuple[int, ...] | None = None,
        available_pool_blocks: tuple[int, ...] | None = None,
    ) -> None:
        super().__init__(message)
        self.required_pool_blocks = required_pool_blocks
        self.available_pool_blocks = available_pool_blocks
        self.required_bytes = required_bytes
        self.available_bytes = available_bytes
        self.max_model_len = max_model_len
        self.largest_fitting_len = largest_fitting_len
        self.reason = reason
        self.required_blocks = required_blocks
        self.available_blocks = available_blocks
        self.bytes_per_block = bytes_per_block
        self.where = where

    def on_rank(self, where: str) -> InsufficientMemoryError:
        """This error, said of one rank: the same figures, ``where`` set, the message prefixed.

        Args:
            where: the rank, as the message should start (``"rank 1 (pp stage 0, tp rank 1)"``).
        """
        # every figure __init__ keeps is stored under its keyword's name, so all carry over
        # (names with dunders, such as add_note's __notes__, are Python's own, not figures)
        figures = {name: value for name, value in vars(self).items() if not name.startswith("__")}
        return InsufficientMemoryError(f"{where}: {self}", **{**figures, "where": where})


class MultiplePoolsError(KVCoreError, ValueError):
    """A one-pool figure (``bytes_per_block``, a single forced block count) was asked of a plan,
    or for a plan, of several block pools; the message names the per-pool figure to use.

    Attributes:
        num_pools: the pools the policy makes, when block counts were forced (else ``None``).
        forced_counts: how many block counts were forced (else ``None``).
        policy: the policy's name, when block counts were forced (else ``None``).
    """

    def __init__(
        self,
        message: str = "",
        *,
        num_pools: int | None = None,
        forced_counts: int | None = None,
        policy: str | None = None,
    ) -> None:
        self.num_pools = num_pools
        self.forced_counts = forced_counts
        self.policy = policy
        super().__init__(message)


class PlanValidationError(KVCoreError, ValueError):
    """A plan breaks one or more layout invariants; ``problems`` lists every one of them.

    Attributes:
        problems: one sentence per broken rule.
        policy: the policy that made the plan, where known.
        source: where the plan came from, where known (``"plan.json"``, ``"allocate()"``).
    """

    def __init__(self, problems: list[str], *, policy: str | None = None, source: str | None = None) -> None:
        self.problems = list(problems)
        self.policy = policy
        self.source = source
        shown = "; ".join(self.problems[:10])
        more = f" (and {len(self.problems) - 10} more)" if len(self.problems) > 10 else ""
        whose = f" of policy {policy!r}" if policy is not None else ""
        where = f" ({source})" if source is not None else ""
        super().__init__(f"the plan{whose}{where} is invalid: {shown}{more}")

    def about(self, *, policy: str | None = None, source: str | None = None) -> PlanValidationError:
        """The same problems, said of ``policy`` and ``source`` (those already set are kept)."""
        return PlanValidationError(
            self.problems,
            policy=self.policy if self.policy is not None else policy,
            source=self.source if self.source is not None else source,
        )


class DeviceUnavailableError(KVCoreError, RuntimeError):
    """The device asked for does not exist here (e.g. ``cuda`` without a visible GPU), or kvcore
    cannot measure its memory (``meta``, ``mps``: give the KV cache a fixed size instead).

    Attributes:
        device: the device asked for (``"cuda:3"``), or ``None`` where not given.
    """

    def __init__(self, message: str, *, device: str | None = None) -> None:
        super().__init__(message)
        self.device = device


class MemoryProfilingError(KVCoreError, RuntimeError):
    """Profiling found no room for a KV cache, or device memory changed under it; the message
    has the numbers (total, free, held outside torch, the profile run's peak, the cap)."""


class KVCacheAllocationError(KVCoreError, MemoryError):
    """Allocating the KV cache failed; everything allocated so far was released.

    Attributes:
        requested_bytes: bytes the plan asked for in all.
        allocated_bytes: bytes that had been allocated (and were released) when it failed.
        free_bytes: free device memory after the release, or ``None`` where unknown.
        device: where it was allocating (``"cuda:0"``), or ``None`` where not given.
        num_allocations: how many allocations were asked for, or ``None`` where not given.
        failure: the allocator's error in one line (``"OutOfMemoryError: CUDA out of memory"``),
            or ``None`` where the raiser wrote its own message (no fix to suggest): with it,
            :func:`kvcore.error_messages.render` words the message and its fix.
    """

    def __init__(
        self,
        message: str = "",
        *,
        requested_bytes: int,
        allocated_bytes: int,
        free_bytes: int | None,
        device: str | None = None,
        num_allocations: int | None = None,
        failure: str | None = None,
    ) -> None:
        super().__init__(message)
        self.requested_bytes = requested_bytes
        self.allocated_bytes = allocated_bytes
        self.free_bytes = free_bytes
        self.device = device
        self.num_allocations = num_allocations
        self.failure = failure


class KVCacheBindingError(KVCoreError, LookupError):
    """Views could not be bound: a layer has no target, a target has no view, or two layers
    claim one slot. The message names every missing and extra layer."""


class BlockPoolExhaustedError(KVCoreError, RuntimeError):
    """The block pool has too few free block ids (or no free aligned run) for a request.

    Attributes:
        requested_blocks: block ids the operation needed.
        free_blocks: block ids free at the time.
    """

    def __init__(self, message: str, *, requested_blocks: int, free_blocks: int) -> None:
        super().__init__(message)
        self.requested_blocks = requested_blocks
        self.free_blocks = free_blocks


class HostTierError(KVCoreError, RuntimeError):
    """A host tier cannot take what it was asked to: pages of a kind that stays on the device,
    or more pages than it has free rows for."""


class DistributedAgreementError(KVCoreError, RuntimeError):
    """Ranks could not agree on a plan: some did not answer in time, one raised, or the store
    that carries the agreement went away. The message names the ranks.

    Attributes:
        ranks: the ranks at fault (those that did not answer, or that raised).
        round_id: the agreement round (``"plan/1"``) in which it happened.
        attempt: the attempt the agreement ran in (its store namespace), when known.
    """

    def __init__(
        self, message: str, *, ranks: tuple[int, ...], round_id: str, attempt: str | None = None
    ) -> None:
        super().__init__(message)
        self.ranks = ranks
        self.round_id = round_id
        self.attempt = attempt


class StoreUnavailableError(DistributedAgreementError):
    """The key-value store that carries the agreement went away (connection lost) or stopped
    answering (a store call outlived the round's deadline). No rank is blamed: ``ranks`` is
    empty and ``host`` names the store (``"127.0.0.1:29500"``, ``"file /tmp/store"``; ``None``
    when unknown).
    """

    def __init__(self, message: str, *, round_id: str, host: str | None, attempt: str | None = None) -> None:
        super().__init__(message, ranks=(), round_id=round_id, attempt=attempt)
        self.host = host


class AttemptReusedError(DistributedAgreementError):
    """An agreement's fixed namespace (``run_id``, torchrun's run id and restart count) was used
    by an earlier run on the same store: its keys and decisions are there, so the run would read
    another run's decisions. Every rank of the run raises it; ``ranks`` is empty and ``attempt``
    names the namespace. The fix: a new ``run_id`` for every run (or none: kvcore draws one).
    """


class AgreementMismatchError(DistributedAgreementError):
    """Ranks were started with different inputs that must match (tp/pp size, policy, request
    length, plan options, forced block count, kvcore version, model identity), or initialized
    different plans. ``field`` names what differs and ``ranks`` the ranks that differ from the
    majority.
    """

    def __init__(
        self, message: str, *, ranks: tuple[int, ...], round_id: str, field: str, attempt: str | None = None
    ) -> None:
        super().__init__(message, ranks=ranks, round_id=round_id, attempt=attempt)
        self.field = field


__all__ = [
    "AgreementMismatchError",
    "AttemptReusedError",
    "BlockPoolExhaustedError",
    "DeviceUnavailableError",
    "DistributedAgreementError",
    "DuplicateRegistrationError",
    "GroupLimitError",
    "InsufficientMemoryError",
    "InvalidInputError",
    "InvalidSpecError",
    "KVCacheAllocationError",
    "KVCacheBindingError",
    "KVCoreError",
    "MemoryProfilingError",
    "ModelConfigError",
    "PlanValidationError",
    "PluginLoadError",
    "PluginValidationError",
    "PolicyNotApplicableError",
    "ShortfallReason",
    "SpecMismatchError",
    "StoreUnavailableError",
    "UnknownGpuError",
    "UnknownModelError",
    "UnknownPolicyError",
    "UnknownSpecKindError",
]
