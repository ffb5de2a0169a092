"""How much admission work (vision-tower units, prefill rows) one engine step may do while
rows decode: a time budget, `--admission-budget` x the decode step, sized from measured costs.

Every running stream waits for the whole engine step between two tokens, so the image work a
step does while rows decode is a stall for all of them. The work comes in units whose cost
varies by orders of magnitude across devices and image sizes (one tower block over a 448 px
image: ~0.1 s on a 2-core CPU, a few ms on an H200; a 32-row prefill block: ~2 ms on the CPU),
so a fixed count of units per step is either a freeze on one device or a crawl on another.
Instead the `CostModel` keeps running estimates (exponentially weighted means, seconds):

- the decode step: the whole engine step's wall time when it did no admission work, as the
  median of the last DECODE_WINDOW such steps (a mean would follow the outliers up: on the
  shared 2-core machine a tenth of plain 3 ms steps took 10-45 ms, and an inflated step
  estimate is a larger budget, so longer gaps, exactly where the machine is already slow);
- each tower unit, keyed by `gateway.engine.model.vision.Unit` (kind, patches of the tower
  call, output shape: attention cost grows super-linearly with an image's patches, and an
  exact key needs no model of that growth; sizes repeat in serving);
- prefill, per query row of the forwards (a row of a padded final block counts);
- the overrun of a step that did admission work: its wall time beyond the plain decode step
  and the work the stages measured. On a GPU the decode of such a step waits for the work
  queued before it and runs slower beside it (H200, 7B: 20 ms against 14), and a step where
  a long row joins the batch pays the join (its KV merged into every layer's buffers) on top:
  measured separately for steps with and without a join.

A `StepBudget` then lets each stage take units while the step's spent time plus the next
unit's estimate stays within ratio x decode step less the expected overrun (so the whole step,
not only its admission work, stays near (1 + ratio) x decode step), and always at least one
unit per step, so admission never stops: the prefill stage (older requests) always gets its
first block; the tower gets its first unit whatever it costs only when no prefill block ran
in the step, else what the budget left (a step with a prefill block and a tower unit beyond
it ran 60-100 ms on the H200 against a 15-25 ms decode). A unit never seen before counts as
over budget unless it is the step's first. The one exception is a step where rows join
while others decode and the expected join alone fills the budget: it does no other admission
work (`join_only`), since the join is that step's progress. Ratio 0 is the old fixed rule: one
tower unit and one prefill chunk budget per step. The estimates belong to one engine: one
model on one device in one process.

Engine thread only.
"""

from __future__ import annotations

import statistics
from collections import deque
from collections.abc import Hashable

# Weight of a new sample in the running means: ~10 samples of memory, so a change of load (a
# noisy neighbour, a new image size) shows within a few steps without one outlier ruling.
EWMA_WEIGHT = 0.2
# Plain decode steps whose median is the decode-step estimate.
DECODE_WINDOW = 31


class RunningMean:
    """Exponentially weighted mean of samples (seconds); None before the first sample."""

    def __init__(self, weight: float = EWMA_WEIGHT) -> None:
        self.weight = weight
        self.value: float | None = None

    def add(self, sample: float) -> None:
        if self.value is None:
            self.value = sample
        else:
            self.value += self.weight * (sample - self.value)


class RunningMedian:
    """Median of the last `window` samples (seconds); None before the first sample."""

    def __init__(self, window: int = DECODE_WINDOW) -> None:
        self._samples: deque[float] = deque(maxlen=window)
        self.value: float | None = None

    def add(self, sample: float) -> None:
        self._samples.append(sample)
        self.value = statistics.median(self._samples)


class CostModel:
    """Running cost estimates of one engine (module doc)."""

    def __init__(self) -> None:
        self.decode_step = RunningMedian()
        self.prefill_row = RunningMean()  # seconds per query row of a prefill forward
        self.overrun = RunningMean()  # seconds beyond decode + measured work, no join
        self.join_overrun = RunningMean()  # the same in steps where rows joined the batch
        self._units: dict[Hashable, RunningMean] = {}

    def unit(self, key: Hashable) -> float | None:
        """The estimate for a tower unit (seconds), None if never measured."""
        mean = self._units.get(key)
        return None if mean is None else mean.value

    def add_unit(self, key: Hashable, seconds: float) -> None:
        self._units.setdefault(key, RunningMean()).add(seconds)

    def add_prefill(self, rows: int, seconds: float) -> None:
        if rows > 0:
            self.prefill_row.add(seconds / rows)

    def add_overrun(self, seconds: float, joined: bool) -> None:
        """A step with admission work or a join took `seconds` beyond the decode-step
        estimate and its measured work (negative samples count as 0)."""
        (self.join_overrun if joined else self.overrun).add(max(seconds, 0.0))

    def expected_overrun(self, joining: bool) -> float:
        """Seconds a step is expected to take beyond its decode and measured work (0 before
        any sample); a joining step's falls back to a plain admission step's."""
        plain = self.overrun.value or 0.0
        if joining and self.join_overrun.value is not None:
            return max(self.join_overrun.value, plain)
        return plain

    def snapshot(self) -> dict[str, float | int | None]:
        """The current estimates in ms (for the step trace and tests)."""
        ms = lambda v: None if v is None else round(1000 * v, 3)  # noqa: E731
        return {
            "decode_step_ms": ms(self.decode_step.value),
            "prefill_row_ms": ms(self.prefill_row.value),
            "overrun_ms": ms(self.overrun.value),
            "join_overrun_ms": ms(self.join_overrun.value),
            "tower_units": len(self._units),
        }


class StepBudget:
    """One engine step's admission time (seconds): `limit` is None when nothing decodes (no
    one to stall: the stages take their large budgets), else ratio x the decode-step estimate
    less the step's expected overrun (`CostModel.expected_overrun`; `joining`: rows held from
    the previous step join in this one), never below 0 (0 before any estimate: one unit per
    stage until the first decode step is measured). `join_only`: a joining step whose
    expected join leaves nothing: no admission work at all in it.

    A wave (`rows` decoding, `admitting` > `rows` requests still to encode or prefill: 16
    images sent at once, whose first few started decoding before the rest were admitted) is
    admitted as a burst, as when nothing decodes: the requests being admitted outnumber the
    streams they would stall, and admitting them together is what keeps a burst's aggregate
    throughput (one tower group, then one batch). Its limit is scaled by (admitting / rows)
    squared: once because the admitted outnumber the stalled, once because the group's units
    grow with its size (an attention piece of 13 images costs 13 of one image's), so the
    wave's tower takes as few steps as one image's would. Scaled linearly, 16 concurrent
    448 px images on CPU lost ~5% aggregate throughput to the extra decode steps; the few
    running streams still get a token every ~0.1-0.2 s instead of every tower block."""

    def __init__(
        self,
        costs: CostModel,
        ratio: float,
        rows: int = 0,
        admitting: int = 0,
        joining: bool = False,
    ) -> None:
        self.costs = costs
        self.ratio = ratio
        self.fixed = ratio <= 0  # the old rule: one unit per stage and step
        self.wave = 0 < rows < admitting
        step = costs.decode_step.value or 0.0
        scale = (admitting / rows) ** 2 if self.wave else 1.0
        limit = ratio * step * scale - costs.expected_overrun(joining)
        self.limit: float | None = max(limit, 0.0) if rows else None
        self.join_only = joining and rows > 0 and not self.fixed and step > 0 and limit <= 0
        self.spent = 0.0  # admission work measured so far in this step
        self.worked = False  # this step did admission work (so it is no plain decode step)

    def allows(self, estimate: float | None, first: bool) -> bool:
        """May a stage start a unit estimated at `estimate` seconds (None: never measured)?
        `first`: the stage has done nothing yet in this step (allowed unless `join_only`)."""
        if self.join_only:
            return False
        if first or self.limit is None and not self.fixed:
            return True
        if self.fixed or estimate is None or self.limit is None:
            return False
        return self.spent + estimate <= self.limit

    def left(self) -> float | None:
        """Seconds left (None: no limit; never negative)."""
        return None if self.limit is None else max(self.limit - self.spent, 0.0)

    @property
    def holds_joins(self) -> bool:
        """Rows finishing their prefill in this step join the batch at the next step (where
        the budget expects the join), not in this step on top of its admission work: while
        other rows decode under a time limit, outside waves and the old fixed rule."""
        return self.worked and self.limit is not None and not self.wave and not self.fixed

    def record(self, wall: float, joined: bool) -> None:
        """Feed the estimates with this step, which decoded rows in `wall` seconds: with no
        admission work and no join (`joined`) it was a plain decode step (what a running
        stream waits between tokens); under a time limit (no wave, not the fixed rule) one
        that did either adds its overrun: its wall time beyond the decode step and the work
        its stages measured."""
        costs = self.costs
        if not self.worked and not joined:
            costs.decode_step.add(wall)
            return
        step = costs.decode_step.value
        if step and self.limit is not None and not self.wave and not self.fixed:
            costs.add_overrun(wall - step - self.spent, joined)

    def spend(self, seconds: float) -> None:
        self.spent += seconds
        self.worked = True
