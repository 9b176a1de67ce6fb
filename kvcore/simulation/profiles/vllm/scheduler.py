"""The ``vllm`` profile's step (``vllm/v1/core/sched/scheduler.py``, ``Scheduler.schedule``,
``update_from_output``, ``_preempt_request``; ``sched/async_scheduler.py``):
:class:`VllmSimulator`, the top layer."""

from __future__ import annotations

from kvcore.errors import InvalidInputError
from kvcore.simulation.compiled import mypyc_attr
from kvcore.simulation.profiles.vllm.state import FINISHED, PREEMPTED, RUNNING
from kvcore.simulation.profiles.vllm.state_groups import AlignStates
from kvcore.simulation.profiles.vllm_groups import usable_text
from kvcore.simulation.steps import StepRecord


# compiled (kvcore.simulation.compiled), it stays a class a test or a plugin may subclass
@mypyc_attr(allow_interpreted_subclasses=True)
class VllmSimulator(AlignStates):
    """vLLM's scheduler and KV-cache manager over a kvcore plan, one :meth:`step` at a time
    (the arguments are :class:`~kvcore.simulation.profiles.vllm.state.VllmState`'s)."""

    def step(self) -> None:
        """Schedule one step, then take back the output of the step ``lag`` steps ago (or skip
        an idle stretch up to the next arrival).

        Raises:
            InvalidInputError: the first waiting request can never be admitted: the pool is
                empty of requests and it still does not fit.
        """
        if self.done:
            return
        step = self.steps
        arrival, waiting = self._arrival, self._waiting
        upcoming = self._next
        timed = self._step_time is not None
        now = self.clock if self._in_seconds else step
        if not self._running and not waiting and arrival[upcoming] > now:
            # nothing runs or waits: what is still in flight is of finished requests; take it
            # back now, so the idle stretch is skipped in one go (and takes no time)
            while self._outputs:
                self._update_from_output(*self._outputs.popleft())
            if self._in_seconds:  # nothing to run: the clock jumps to the next arrival
                self.clock = arrival[upcoming]
                return
            gap = int(arrival[upcoming]) - step
            self._running_series.extend_repeat(0, gap)
            self._usage_series.extend_repeat(0.0, gap)
            if timed:  # an idle step runs nothing and takes no time
                self._step_end.extend([self.clock] * gap)
            self.steps += gap
            return
        while upcoming < len(arrival) and arrival[upcoming] <= now:
            if self._in_seconds:
                self._queued[upcoming] = step
            waiting.append(upcoming)
            upcoming += 1
        self._next = upcoming
        if self._state_block:  # state groups in align mode (see state_groups)
            self._new_step_starts()
        scheduled, sampled = self._schedule(step)
        tokens = sum(scheduled.values()) + self._steady  # the steady decoders each ran a token
        # nothing ran, runs or will come back (async keeps the last, empty, step in flight)
        if not tokens and not self._running and not any(out[0] for out in self._outputs) and waiting:
            stuck = self.requests[waiting[0]]
            raise InvalidInputError(
                f"{stuck.label} ({stuck.prompt_tokens} prompt + {stuck.output_tokens} output tokens) "
                f"cannot be admitted even with the pool to itself ({usable_text(self.plan)} block ids): "
                "plan more blocks, or give a smaller max_num_batched_tokens"
            )
        self.total_tokens += tokens
        self._running_series.append(len(self._running))
        self._usage_series.append(self._usage())
        if timed:
            self._time_step(step, scheduled)
            token_step = self._token_step
            for r in sampled:
                if token_step[r] < 0:
                    token_step[r] = step
        self._outputs.append((scheduled, sampled, step))
        while len(self._outputs) > self.lag:
            self._update_from_output(*self._outputs.popleft())
        self._join_steady(scheduled, sampled, step)
        self.steps = step + 1
        if self.finished == len(self.requests):
            self._outputs.clear()  # the last (empty) steps in flight

    def _schedule(self, step: int) -> tuple[dict[int, int], set[int]]:
        """``Scheduler.schedule``: tokens per request scheduled in this step, and the requests
        that sample a token in it.

        The fake model runner's part is done here as each request is scheduled, once nothing
        else in the step reads its counts: its tokens are computed and in flight, and it
        samples a token when its chunk reaches its end (then, async, it holds a placeholder).
        """
        running, waiting = self._running, self._waiting
        computed, known, placeholders = self._computed, self._tokens, self._placeholders
        budget, limit, lag, until = self.budget, self.max_model_len, self.lag, self._until
        threshold = self.profile.long_prefill_token_threshold if len(running) + len(waiting) > 1 else 0
        total, in_flight, aligned = self._total, self._in_flight, self._state_block  # (state groups)
        quiet, free_at, cache_at = self._quiet, self._free_at, self._cache_at
        scheduled: dict[int, int] = {}
        sampled: set[int] = set()
        add, preempted = sampled.add, False
        # why a for loop: a preemption pops only requests after this one (or this one, then breaks)
        for r in running:
            if budget <= 0:
                self._settle_from(r, step)
                break
            if until[r]:
                if until[r] > step:  # a steady decoder: one token, counted (see _join_steady)
                    budget -= 1
                    continue
                self._settle(r, step)  # its next event: visited as any request
            done = computed[r]
            out = placeholders[r]
            tokens = known[r]
            if done + 1 == tokens + out:  # a decode (one new token)
                if out and tokens + 1 >= total[r]:
                    continue  # async: its last token is in flight
                # the usual step: a decode short of the next page, the next block to cache and
                # the window's next free (see _note_events), which the manager leaves alone;
                # below quiet it stays under max_model_len, and a decode's token samples
                if done < quiet[r] and tokens < cache_at[r]:
                    flying = in_flight[r]
                    if done - flying < free_at[r]:
                        scheduled[r] = 1
                        budget -= 1
                        computed[r] = done + 1
                        in_flight[r] = flying + 1
                        add(r)
                        placeholders[r] = out + lag
                        continue
            elif out and done + 2 - out >= total[r]:
                continue  # async: its last token is in flight
            new = known[r] + placeholders[r] - done
            if 0 < threshold < new:
                new = threshold
            if new > budget:  # min() of three, spelled out: this loop runs per request and step
                new = budget
            if new > limit - done - 1:
                new = limit - done - 1
            new = self._aligned_split(r, new) if aligned else new  # chunks end on state blocks
            if new <= 0:
                continue
            # the usual step: a decode that crosses no page boundary, frees nothing and caches
            # nothing, which the manager leaves alone (see _note_events)
            if not (
                new == 1
                and done < quiet[r]
                and done - in_flight[r] < free_at[r]
                and (done + 1 if done < known[r] else known[r]) < cache_at[r]
            ):
                granted, preempted_now = self._allocate_or_preempt(r, new)
                preempted = preempted or preempted_now
                if not granted:
                    break
            scheduled[r] = new
            budget -= new
            computed[r] = done + new
            in_flight[r] += new
            if done + new >= known[r] + placeholders[r]:  # not a prefill chunk
                sampled.add(r)
                placeholders[r] += lag
        if not preempted:
            self._schedule_waiting(step, budget, threshold, scheduled, sampled)
        return scheduled, sampled

    def _settle_from(self, r: int, step: int) -> None:
        """The steady decoders from running request ``r`` on did not run in this step: settle them."""
        if self._steady:
            running, until = self._running, self._until
            for held in running[running.index(r) :]:
                if until[held]:
                    self._settle(held, step)

    def _allocate_or_preempt(self, r: int, new: int) -> tuple[bool, bool]:
        """``allocate_slots`` for running request ``r``, preempting the latest running request
        while it fails; returns whether ``r`` got its slots and whether any was preempted."""
        running = self._running
        preempted = False
        while True:
            # a decode with lazy hashing: the lean boundary call
            lean = new == 1 and self._lean_decode and self._lazy
            if self._allocate_decode(r) if lean else self._allocate(r, new, gate=False):
                return True, preempted
            victim = running.pop()
            if victim == r and not running:  # it failed with the pool to itself
                self._check_alone(r)
            self._preempt(victim)
            preempted = True
            if victim == r:
                return False, True

    def _schedule_waiting(
        self, step: int, budget: int, threshold: int, scheduled: dict[int, int], sampled: set[int]
    ) -> None:
        """``schedule``'s second part: the waiting queue first come first served, each taking its
        prefix hit, while the budget lasts and fewer than ``max_num_seqs`` run."""
        profile, running, waiting = self.profile, self._running, self._waiting
        known, placeholders = self._tokens, self._placeholders
        in_flight, computed = self._in_flight, self._computed
        lag = self.lag
        blocked, pools = self._blocked, self.pools
        skipped: list[int] = []
        while budget > 0 and waiting:
            if len(running) >= profile.max_num_seqs:
                break
            r = waiting[0]
            if self._stale[r]:  # its in-flight output is not back yet
                skipped.append(waiting.popleft())
                continue
            gate = blocked.get(r)
            if (
                gate is not None
                and gate[1] == self._prefix_versions.get(self.requests[r].prefix_id, 0)
                and any(n > pool.free for n, pool in zip(gate[0], pools, strict=True))
            ):
                break  # its admission gate fails as it did (see _blocked)
            hit, blocks = self._find_hit(r) if self.caching else (0, None)
            new = known[r] - hit
            if 0 < threshold < new:
                new = threshold
            new = min(new, budget)
            if self._state_block:
                new = self._aligned_split(r, new, hit)
                if not new:
                    break
            if not self._allocate(r, new, gate=profile.reserve_full_isl, hit=hit, hit_blocks=blocks):
                break
            waiting.popleft()
            running.append(r)
            blocked.pop(r, None)
            self.cached_tokens += hit
            self.looked_up_tokens += known[r]
            self._status[r] = RUNNING
            if self._first[r] < 0:
                self._first[r] = step
            scheduled[r] = new
            budget -= new
            computed[r] = hit + new
            in_flight[r] += new
            if hit + new >= known[r] + placeholders[r]:  # the whole prompt: it samples
                sampled.add(r)
                placeholders[r] += lag
        waiting.extendleft(reversed(skipped))

    def _time_step(self, step: int, scheduled: dict[int, int]) -> None:
        """Describe the step as a :class:`~kvcore.simulation.steps.StepRecord` (its tokens are
        counted as computed already) and advance the clock by the step-time model's seconds."""
        model = self._step_time
        assert model is not None
        steady = self._steady
        if not scheduled and not steady:  # async: nothing to schedule while the last tokens are in flight
            self._step_end.append(self.clock)  # the engine runs no model: the step takes no time
            return
        computed = self._computed
        # the steady decoders: each had computed (its count when it became steady, less that
        # step) + this step tokens before the step, and attends to those and its new token
        decodes = steady
        context = pairs = self._steady_base + steady * (step + 1)
        prefills = prefill = 0
        for r, n in scheduled.items():
            c = computed[r] - n  # computed before the step
            context += c + n
            if n == 1:
                decodes += 1
                pairs += c + 1
            else:
                prefills += 1
                prefill += n
                pairs += n * c + n * (n + 1) // 2  # each new token attends to itself and all before
        record = StepRecord(prefill, decodes, decodes + prefills, context, pairs)
        self._advance_clock(step, record)

    def _update_from_output(self, scheduled: dict[int, int], sampled: set[int], step: int) -> None:
        """``Scheduler.update_from_output``: the tokens of step ``step`` come back."""
        finished: list[int] = []
        in_flight, stale_tokens, status = self._in_flight, self._stale, self._status
        known, placeholders, total = self._tokens, self._placeholders, self._total
        cache, tails, cache_at = self.caching, self._tails, self._cache_at
        computed = self._computed
        for r, n in scheduled.items():
            in_flight[r] -= n
            if stale_tokens[r] > 0:  # a preempted request's output (rare)
                stale_tokens[r] -= n
                stale = True
            else:
                stale = False
            if r not in sampled or status[r] == FINISHED:
                continue
            out = placeholders[r]
            tokens_known = known[r] = known[r] + 1
            if out and not stale:
                placeholders[r] = out - 1
                if tokens_known < total[r]:  # the usual decode: not finished
                    # short of the next block to cache (_note_events' bound; min(tokens,
                    # tokens_known) below), it would hash nothing
                    if cache and (tails or tokens_known >= cache_at[r]) and status[r] == RUNNING:
                        tokens = computed[r] - in_flight[r]
                        if tails or (tokens if tokens < tokens_known else tokens_known) >= cache_at[r]:
                            self._cache_blocks(r, tokens)
                    continue
                if cache and status[r] == RUNNING:
                    # vLLM caches a finishing request's blocks too, then frees them: the blocks
                    # it completed go to the back of the free queue, not the front
                    self._cache_blocks(r, computed[r] - in_flight[r])
            if tokens_known >= total[r]:
                finished.append(r)
                if self._step_time is not None:
                    self._finish_step[r] = step
        if finished:
            for r in finished:
                if self._status[r] == RUNNING:
                    self._free(r, live=False)
                else:
                    self._waiting.remove(r)
                self._status[r] = FINISHED
            done = set(finished)
            self._running = [r for r in self._running if r not in done]
            self.finished += len(finished)

    def _check_alone(self, r: int) -> None:
        """Stop a run that would never end: request ``r``, running alone, failed to grow where it
        failed alone before, and no request finished in between. With the admission gate off
        (``reserve_full_isl=False``) a request is admitted when its first chunk fits, so one
        that cannot get past some point even with the pool to itself is preempted, admitted
        again and preempted at that same point without end (with prefix caching on it usually
        finds its own blocks and gets further each time, so this never fires).

        Raises:
            InvalidInputError: ``r`` failed alone at the same point twice.
        """
        point = (self._computed[r], self.finished)
        if self._failed_alone.get(r) == point:
            stuck = self.requests[r]
            raise InvalidInputError(
                f"{stuck.label} ({stuck.prompt_tokens} prompt + {stuck.output_tokens} output tokens) "
                f"cannot grow past {point[0]:,} computed tokens even with the pool to itself "
                f"({usable_text(self.plan)} block ids), so it would be admitted and preempted without end: "
                "plan more blocks, give a smaller max_num_batched_tokens, or keep reserve_full_isl on "
                "(vLLM's default: a request waits until its whole prompt fits)"
            )
        self._failed_alone[r] = point

    def _preempt(self, r: int) -> None:
        if self._until[r]:  # a steady decoder (it is after the request being scheduled)
            self._settle(r, self.steps)
        # its own blocks freed before their window, still in the queue (with preempted_runs
        # they are hashed when it is next looked up, with those it frees now)
        if self._pending[r] and not self._preempted_runs:
            for key in self._pending[r]:
                self._expand(key, r)
            self._pending[r] = []
        self._free(r, live=True)
        self.recomputed_tokens += self._computed[r]
        self._status[r] = PREEMPTED
        self._computed[r] = 0
        self._stale[r] = self._in_flight[r]
        self._placeholders[r] = 0
        self._waiting.appendleft(r)
        self.preemptions += 1

    def _usage(self) -> float:
        """``BlockPool.get_usage`` (``1 - free / usable``) of the fullest pool."""
        return max((1 - p.free / p.usable for p in self.pools if p.usable), default=0.0)

    def settings(self) -> tuple[tuple[str, object], ...]:
        """The profile's settings (reported with the result)."""
        return self.profile.settings()
