"""The ``vllm`` profile's steady decoders (speed path ``steady_decoders``): a request whose next
steps are each the usual decode (no page taken, freed or cached, no finish) is counted, not
visited, until the first step one of its event bounds is reached."""

from __future__ import annotations

from kvcore.simulation.compiled import mypyc_attr
from kvcore.simulation.profiles.vllm.lean import LeanPaths
from kvcore.simulation.profiles.vllm.state import RUNNING


# every base of VllmSimulator allows what it allows (kvcore.simulation.compiled)
@mypyc_attr(allow_interpreted_subclasses=True)
class SteadyDecoders(LeanPaths):
    """Making a decoder steady and bringing it up to date (see the module docstring)."""

    def _join_steady(self, scheduled: dict[int, int], sampled: set[int], step: int) -> None:
        """Make steady the requests of step ``step`` whose next steps are the usual decode.

        A decode that crosses no page boundary, frees no page before a window and caches no
        block (``_note_events``' bounds), whose output neither finishes the request nor caches
        (``_update_from_output``), changes nothing but its own counts: computed and known
        tokens each grow by one a step while in-flight tokens and placeholders stay. Such a
        request is not visited step by step: it is *steady* from the next step until the first
        step one of those bounds is reached (``_until``), and its counts are brought up to date
        (:meth:`_settle`) when it is visited then, or earlier when it is preempted or the token
        budget runs out before it. Only requests visited in this step can become steady: the
        others' bounds did not change.

        With async scheduling the output of a steady decoder's last step is still in flight when
        it is settled: it joins that step's output and is taken back as any other.
        """
        if not self._steady_decoders:
            return
        until, status, stale = self._until, self._status, self._stale
        computed, known, in_flight = self._computed, self._tokens, self._in_flight
        placeholders = self._placeholders
        quiet, cache_at, free_at, total = self._quiet, self._cache_at, self._free_at, self._total
        lag, requests = self.lag, self.requests
        caching_output = self.caching and lag  # async: taking an output back may cache blocks
        for r, n in scheduled.items():
            if n != 1 or r not in sampled or status[r] != RUNNING or stale[r] or until[r]:
                continue
            c, k, out = computed[r], known[r], placeholders[r]
            if c + 1 != k + out:  # not a decode in the next step
                continue
            # steps it stays steady: each bound the first step that reaches it, less one
            steps = min(
                quiet[r] - c,  # _schedule: computed below quiet (no page)
                cache_at[r] - k,  # known below the next block to cache
                free_at[r] + in_flight[r] - c,  # processed below the window's next free
                total[r] - k - 1 - lag,  # no output that finishes it (async: nor the last in flight)
            )
            if caching_output:
                # no output taken back while it is steady caches a block: the m-th after this
                # step's has min(processed, known) = first + m, and caches from cache_at on
                # (with partial tails too: _cache_blocks rounds down to the scheduler block, and
                # a tail is registered at the first multiple past the prompt's last hash block,
                # where _note_events puts cache_at)
                first = min(c + 1 - in_flight[r], k + 1)
                # the output of its last steady step is taken back after it is settled, in
                # another place of the step's order: it may cache only blocks no other request
                # can hold the content of (no shared prefix)
                last = 1 if requests[r].prefix_tokens else 0
                if cache_at[r] - first - last < steps:
                    steps = cache_at[r] - first - last
            if steps < 1:
                continue
            until[r] = step + 1 + steps
            self._since[r] = step + 1
            self._steady += 1
            self._steady_base += c - step - 1

    def _settle(self, r: int, step: int) -> None:
        """Bring steady request ``r``'s counts to where they stand when step ``step`` begins (the
        steps it ran since it became steady, see :meth:`_join_steady`) and make it unsteady.

        Async: the output of its last step is in flight; it joins that step's output, and its
        counts stand as before that output is taken back (the first output it had in flight when
        it became steady was taken back as any other).
        """
        since = self._since[r]
        base = self._computed[r]
        ran = step - since
        if ran > 0:
            lag = self.lag
            self._computed[r] = base + ran
            self._tokens[r] += ran - lag
            if lag:
                self._in_flight[r] += 1
                self._placeholders[r] += 1
                scheduled, sampled, _ = self._outputs[-1]
                scheduled[r] = 1
                sampled.add(r)
        self._until[r] = 0
        self._steady -= 1
        self._steady_base -= base - since
