"""Which plan ``kvcore simulate`` (and ``kvcore tune``) replays under a scheduler profile: the
plan the profile's engine would run.

vLLM does not run kvcore's own plan of a model as ``kvcore plan`` makes it: kvcore's vLLM plugin
re-plans it with :func:`~kvcore.integrations.vllm.rules.plan_for_vllm` (block 0 kept as vLLM's
null block, sliding and chunked layers sized for the tokens in flight, and, for a hybrid model
such as Jamba, attention blocks enlarged until every page is one block id). A vLLM profile
(``vllm``, ``vllm-reference``) replaying kvcore's own plan would describe a pool vLLM never has,
so under such a profile every candidate is planned that way (states kept for prefix caching,
``--state-cache-mode align``, as vLLM's ``mamba_cache_mode='align'`` keeps them). A candidate
vLLM cannot run at all (several block pools, a page over a run of block ids, a state kept per
block, ``--state-cache-mode all``, which vLLM has no mode for) is still replayed, as kvcore
plans it under vLLM's sizing (the same fallback ``kvcore tune`` searches with), and the output
names it and why. Other profiles replay kvcore's
own plan. One line of the output (and the ``--json`` object's ``replayed_plans``) says which.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import attrs

from kvcore.errors import InsufficientMemoryError, KVCoreError, PolicyNotApplicableError

if TYPE_CHECKING:
    from kvcore.cli.options import PlanningArgs
    from kvcore.integrations.vllm.rules import VllmRules
    from kvcore.plan import KVCachePlan
    from kvcore.planning.compare import Candidate
    from kvcore.planning.registry import Registry
    from kvcore.planning.request import PlanRequest
    from kvcore.spec import KVCacheSpec

#: ``planned_as`` of a plan made as vLLM runs it.
AS_VLLM = "vllm"
#: ``planned_as`` of kvcore's own plan.
AS_KVCORE = "kvcore"


def replays_vllm_plan(profile: Any) -> bool:
    """Whether ``profile`` is vLLM's scheduler (``vllm``, ``vllm-reference``, any
    :class:`~kvcore.simulation.profiles.vllm.VllmProfile`), whose candidates are planned as vLLM
    runs them."""
    from kvcore.simulation.profiles.vllm import VllmProfile

    return isinstance(profile, VllmProfile)


class ReplayedPlans:
    """The planner of one run under ``profile``, and what it made of each candidate.

    Args:
        profile: the scheduler profile the candidates are replayed under.
        registry: where the policies are looked up.
    """

    def __init__(self, profile: Any, registry: Registry) -> None:
        self.as_vllm = replays_vllm_plan(profile)
        self.async_scheduling = bool(getattr(profile, "async_scheduling", True))
        self.registry = registry
        # id(plan) -> (the plan, kept so that its id is not reused; why vLLM cannot run it)
        self._refused: dict[int, tuple[KVCachePlan, str]] = {}
        # id(plan) -> (the plan; its attention block sizes "asked -> made")
        self._enlarged: dict[int, tuple[KVCachePlan, str]] = {}
        self._rules: VllmRules | None = None

    def settle_auto_length(self, args: PlanningArgs, specs: Mapping[str, KVCacheSpec]) -> PlanningArgs:
        """``args`` with ``--max-model-len auto`` made one number
        (:func:`~kvcore.cli.inputs.settle_auto_length`: the longest request the ``auto``
        policy's plan admits), and under a vLLM profile lowered, where vLLM's plan of that
        length does not fit the budget (its null block and tokens in flight take room), to the
        longest its plan admits (found by bisection); said on stderr.

        Raises:
            KVCoreError: as :func:`~kvcore.cli.inputs.settle_auto_length`, or not one request
                fits the budget as vLLM runs the plan.
        """
        from kvcore.cli import inputs

        auto = args.max_model_len == "auto"
        args = inputs.settle_auto_length(args, self.registry, specs)
        if not auto or not self.as_vllm:
            return args
        assert isinstance(args.max_model_len, int)

        def fits(length: int) -> bool:
            one = attrs.evolve(args, policy="auto", num_blocks=None, tp=None, pp=None, max_model_len=length)
            try:
                self.plan(inputs.plan_request(one, specs))
            except InsufficientMemoryError:
                return False
            return True

        high = args.max_model_len
        fitted = fits(high)
        low = 0  # the longest length known to fit (0: none yet)
        while not fitted and high - low > 1:
            middle = (low + high) // 2
            low, high = (middle, high) if fits(middle) else (low, middle)
        # the probes' plans are gone: what was noted of them must not be read for the candidates'
        self._refused.clear()
        self._enlarged.clear()
        if fitted:
            return args
        if not low:
            self.plan(inputs.plan_request(attrs.evolve(args, policy="auto", max_model_len=1), specs))
        print(
            f"kvcore: note: as vLLM runs the plan (plan_for_vllm: its null block and tokens in flight), "
            f"--max-model-len auto = {low:,} tokens: the longest request the auto policy's plan admits there",
            file=sys.stderr,
        )
        return attrs.evolve(args, max_model_len=low)

    def planner(self) -> Any:
        """The planner :func:`~kvcore.planning.compare.compare_policies` takes: ``None``
        (kvcore's own) unless the profile is vLLM's."""
        return self.plan if self.as_vllm else None

    def plan(self, request: PlanRequest) -> KVCachePlan:
        """``request`` planned as vLLM runs it; where vLLM cannot, kvcore's plan under vLLM's
        sizing (its tokens in flight and null block), remembered with the reason.

        Raises:
            KVCoreError: as :func:`~kvcore.integrations.vllm.rules.plan_for_vllm`, but for the
                refusals that leave a plan vLLM cannot run.
        """
        from kvcore.integrations.tuned import vllm_rules
        from kvcore.integrations.vllm.rules import VllmIntegrationError, plan_for_vllm
        from kvcore.planning.planner import plan as plan_request

        rules = vllm_rules(request.context, async_scheduling=self.async_scheduling)
        self._rules = rules
        context = request.context
        sized = attrs.evolve(
            request,
            context=attrs.evolve(
                rules.context(),
                state_cache_mode=context.state_cache_mode,
                num_speculative_tokens=context.num_speculative_tokens,
            ),
        )
        why = ""
        if context.state_cache_mode != rules.state_cache_mode:
            why = (
                f"a state per block (--state-cache-mode {context.state_cache_mode}), a mode vLLM does not "
                "have (its mamba_cache_mode is 'none' or 'align')"
            )
        elif context.num_speculative_tokens:
            why = "speculative tokens, which plan_for_vllm does not size for"
        elif request.options.pool_split is not None:
            why = "a pool split: several block pools"
        else:
            try:
                made = plan_for_vllm(sized, rules, registry=self.registry)
            except (VllmIntegrationError, PolicyNotApplicableError) as exc:
                # several pools, or pages over runs of block ids; a policy that cannot plan
                # the layers at all raises again below
                why = str(exc).split("; ", 1)[0]
                if isinstance(exc, VllmIntegrationError) and "block pools" in why:
                    why = "several block pools, where vLLM has one"
            else:
                self._note_enlarged(made, sized, rules)
                return made
        made = plan_request(
            attrs.evolve(sized, options=rules.options(request.options)), registry=self.registry
        ).plans[0]
        self._refused[id(made)] = (made, why)
        return made

    def _note_enlarged(self, made: KVCachePlan, sized: PlanRequest, rules: VllmRules) -> None:
        """Remember the attention block sizes of ``made`` where plan_for_vllm enlarged them
        (every page one block id) beyond what the policy plans under vLLM's sizing."""
        from kvcore.planning.planner import plan as plan_request

        got = _attention_blocks(made)
        if not any(not spec.page_scales_with_block_size for spec in sized.specs.values()):
            return  # plan_for_vllm enlarges blocks only to fit a state group's page
        try:
            policys = plan_request(
                attrs.evolve(sized, options=rules.options(sized.options)), registry=self.registry
            ).plans[0]
        except KVCoreError:
            return
        if (before := _attention_blocks(policys)) != got:
            self._enlarged[id(made)] = (made, f"{before} -> {got}")

    def planned_as(self, candidate: Candidate) -> str | None:
        """``"vllm"`` for a plan made as vLLM runs it, ``"kvcore"`` for kvcore's own, ``None``
        without a plan."""
        if candidate.plan is None:
            return None
        return AS_VLLM if self.as_vllm and id(candidate.plan) not in self._refused else AS_KVCORE

    def refused(self, candidate: Candidate) -> str | None:
        """Why vLLM cannot run the candidate's plan (replayed as kvcore's), else ``None``."""
        noted = self._refused.get(id(candidate.plan)) if candidate.plan is not None else None
        return noted[1] if noted is not None else None

    def line(self, candidates: Sequence[Candidate]) -> str:
        """The output's line: which plan is simulated, and the candidates vLLM would not run."""
        if not self.as_vllm:
            return "plans: kvcore's own, as kvcore plan makes them"
        rules = self._rules
        flight = f", {rules.max_in_flight_tokens:,} tokens in flight" if rules is not None else ""
        text = (
            "plans: as vLLM runs them (plan_for_vllm, as kvcore's vLLM plugin re-plans: null block"
            f"{flight}, one block id per page)"
        )
        enlarged = [
            f"{c.policy} ({self._blocks(c)})"
            for c in candidates
            if c.plan is not None and self.refused(c) is None and self._blocks(c)
        ]
        if enlarged:
            text += "; attention blocks enlarged: " + ", ".join(dict.fromkeys(enlarged))
        others: dict[str, list[str]] = {}  # why -> the policies
        for c in candidates:
            if (why := self.refused(c)) and c.policy not in others.setdefault(why, []):
                others[why].append(c.policy)
        for why, policies in others.items():
            text += f"; {', '.join(policies)}: kvcore's plan, which vLLM would not run ({why})"
        return text

    def _blocks(self, candidate: Candidate) -> str:
        """The attention block sizes plan_for_vllm enlarged, as ``"16 -> 1,024"``, else ``""``."""
        noted = self._enlarged.get(id(candidate.plan))
        return noted[1] if noted is not None else ""

    def to_dict(self, candidates: Sequence[Candidate]) -> dict[str, Any]:
        """The ``--json`` object's ``replayed_plans``: the line and each candidate's."""
        return {
            "planned_as": AS_VLLM if self.as_vllm else AS_KVCORE,
            "line": self.line(candidates),
        }

    def candidate_row(self, candidate: Candidate) -> dict[str, Any]:
        """A candidate's ``planned_as`` and, where vLLM would not run its plan, why."""
        why = self.refused(candidate)
        return {"planned_as": self.planned_as(candidate), **({"vllm_would_not_run": why} if why else {})}


def _attention_blocks(plan: KVCachePlan) -> str:
    """The plan's attention block sizes as a list, ``"16"`` or ``"16, 32"``."""
    sizes = {g.spec.block_size for g in plan.groups if g.spec.page_scales_with_block_size}
    return ", ".join(f"{size:,}" for size in sorted(sizes))
