"""The admission time budget (gateway.engine.scheduler.budget) and what it sizes.

Pinned: the budget's arithmetic (at least one unit per step: the tower's first unit is free
only when no prefill block ran in the step; never-measured units only first,
ratio 0 is the old one-unit rule, no limit when nothing decodes, the expected overrun of a step
with admission work or a join comes off the limit, a join that fills it is the step's only
work); the prefill rows it grants
are whole exact-reuse blocks (the budget decides how many blocks, never where one starts); in
the engine, while a row decodes, a tiny budget runs one tower unit per step and a large one
many, and the answers are the same bit for bit under any budget and equal to the uncached
answer, with every prefill forward one aligned block.
"""

from __future__ import annotations

import pytest
from support import (
    EngineHarness,
    block_shaped,
    chat_body,
    noise_image,
    record_prefill_forwards,
)

from gateway.config import CacheConfig
from gateway.engine.scheduler import encode_group
from gateway.engine.scheduler.budget import CostModel, RunningMean, RunningMedian, StepBudget
from gateway.engine.scheduler.prefill_stage import budget_rows


def _budget(
    ratio: float = 2.0, rows: int = 4, admitting: int = 1, step: float | None = 0.01
) -> StepBudget:
    costs = CostModel()
    if step is not None:
        costs.decode_step.add(step)
    return StepBudget(costs, ratio, rows, admitting)


def test_running_mean_follows_samples() -> None:
    mean = RunningMean(weight=0.5)
    assert mean.value is None
    mean.add(4.0)
    assert mean.value == 4.0
    mean.add(0.0)
    assert mean.value == 2.0


def test_the_decode_step_estimate_ignores_outlier_steps() -> None:
    """Invariant: a few slow plain steps (a noisy neighbour) do not inflate the decode-step
    estimate, and so not the budget; a lasting change moves it within the window."""
    step = RunningMedian(window=5)
    for sample in (0.003, 0.003, 0.045, 0.003, 0.030):
        step.add(sample)
    assert step.value == 0.003
    for _ in range(3):
        step.add(0.010)
    assert step.value == 0.010


def test_a_stage_always_gets_its_first_unit_and_then_only_what_fits() -> None:
    b = _budget()  # 2 x 10 ms
    assert b.limit == pytest.approx(0.02)
    assert b.allows(None, first=True) and b.allows(1.0, first=True)
    assert b.allows(0.015, first=False)
    assert not b.allows(None, first=False)  # never measured: only as a stage's first
    b.spend(0.015)
    assert b.worked and b.left() == pytest.approx(0.005)
    assert not b.allows(0.006, first=False) and b.allows(0.004, first=False)
    b.spend(1.0)
    assert b.left() == 0.0


def test_after_a_prefill_block_the_tower_gets_only_what_the_budget_left() -> None:
    """One free unit a step: a tower unit that does not fit what a prefill block left waits
    for the next step (it would make the step prefill + unit + decode); with nothing run
    before it in the step, it runs whatever its estimate."""
    from types import SimpleNamespace

    def group():  # noqa: ANN202 - a tower with units "u0", "u1" left
        return SimpleNamespace(pending="u0", built=True, steps=iter(["u1"]))

    after_prefill = _budget()  # 20 ms
    after_prefill.costs.add_unit("u0", 0.015)
    after_prefill.spend(0.015)  # the prefill block
    g = group()
    assert not encode_group.step_group(None, g, after_prefill, free_first=False)  # type: ignore[arg-type]
    assert g.pending == "u0"  # nothing ran
    alone = _budget()
    alone.costs.add_unit("u0", 0.03)  # over the whole budget, but the step's first unit
    g = group()
    assert not encode_group.step_group(None, g, alone, free_first=True)  # type: ignore[arg-type]
    assert g.pending == "u1"  # one unit ran, then the next did not fit


def test_building_a_groups_graph_is_a_unit_of_its_own() -> None:
    """The first call of a group's tower (the graph's build: pixels to the device, indices
    that wait for queued work) is budgeted like a tower unit: after a prefill block it waits
    for a step with room (H200: built untimed after a block, it made 63-83 ms steps against a
    20 ms decode), and as a step's free unit it leaves the next unit to the budget."""
    from types import SimpleNamespace

    build = "build"

    def group():  # noqa: ANN202 - an unbuilt tower: its build yields "u0", then "u1"
        return SimpleNamespace(pending=None, built=False, build=build, steps=iter(["u0", "u1"]))

    after_prefill = _budget()  # 20 ms
    after_prefill.spend(0.015)  # the prefill block; the build never measured
    g = group()
    assert not encode_group.step_group(None, g, after_prefill, free_first=False)  # type: ignore[arg-type]
    assert not g.built and g.pending is None
    alone = _budget()
    alone.costs.add_unit("u0", 0.025)  # over the budget: free only as a step's first unit
    g = group()
    assert not encode_group.step_group(None, g, alone, free_first=True)  # type: ignore[arg-type]
    assert g.built and g.pending == "u0"  # built (the free unit); u0 waits


def test_no_limit_when_nothing_decodes_and_one_unit_under_the_old_rule() -> None:
    idle = _budget(rows=0)
    assert idle.limit is None and idle.left() is None
    assert idle.allows(None, first=False) and idle.allows(100.0, first=False)
    fixed = _budget(ratio=0)
    assert fixed.fixed and fixed.allows(0.0, first=True)
    assert not fixed.allows(0.0, first=False)
    unmeasured = _budget(step=None)  # no decode step measured yet: one unit per stage
    assert unmeasured.limit == 0.0 and not unmeasured.allows(0.0001, first=False)


def test_prefill_rows_are_whole_blocks_within_the_time_left() -> None:
    b = _budget()  # 20 ms
    b.costs.add_prefill(32, 0.032)  # 1 ms a row: 20 rows fit, no whole block
    assert budget_rows(2048, 32, b) == 32  # at least one block
    b.costs.prefill_row.value = 0.0001  # 200 rows fit: six whole blocks
    assert budget_rows(2048, 32, b) == 192
    assert budget_rows(128, 32, b) == 128  # capped
    assert budget_rows(512, 32, _budget(ratio=0)) == 512
    assert budget_rows(2048, 32, _budget(rows=0)) == 2048
    assert budget_rows(2048, 32, _budget()) == 32  # per row unmeasured


def test_a_wave_is_admitted_as_a_burst_with_a_scaled_limit() -> None:
    """Invariant: more requests being admitted than rows decoding is a wave: the prefill
    takes its large budget and the time limit grows with (admitting / rows) squared."""
    calm, wave = _budget(rows=4, admitting=4), _budget(rows=3, admitting=13)
    assert not calm.wave and calm.limit == pytest.approx(0.02)
    assert wave.wave and wave.limit == pytest.approx(0.02 * (13 / 3) ** 2)
    assert budget_rows(512, 32, wave) == 512
    assert not _budget(rows=0, admitting=16).wave  # nothing decodes: no limit at all


def test_the_expected_overrun_comes_off_the_limit() -> None:
    """Invariant: the whole step, not only its measured admission work, is what a running
    stream waits for: a step's expected time beyond decode + work shrinks its limit, a
    joining step's by the join's own estimate (at least the plain one), never below 0."""
    costs = CostModel()
    costs.decode_step.add(0.010)
    assert StepBudget(costs, 2.0, rows=4).limit == pytest.approx(0.020)
    costs.add_overrun(0.006, joined=False)
    costs.add_overrun(-1.0, joined=True)  # a negative sample counts as 0
    assert costs.join_overrun.value == 0.0
    assert StepBudget(costs, 2.0, rows=4).limit == pytest.approx(0.014)
    assert StepBudget(costs, 2.0, rows=4, joining=True).limit == pytest.approx(0.014)
    costs.join_overrun.value = 0.030
    joining = StepBudget(costs, 2.0, rows=4, joining=True)
    assert joining.limit == 0.0 and joining.join_only
    assert not joining.allows(0.0, first=True)  # the join is the step's progress
    assert not StepBudget(costs, 2.0, rows=4).join_only
    assert not StepBudget(costs, 0.0, rows=4, joining=True).join_only  # the fixed rule
    assert StepBudget(costs, 2.0, rows=0, joining=True).limit is None
    assert costs.snapshot()["join_overrun_ms"] == 30.0


def test_a_step_feeds_the_decode_estimate_or_an_overrun() -> None:
    """Invariant: a plain decode step feeds the decode-step estimate; a step with work or a
    join under a time limit feeds the matching overrun (its time beyond decode + work), a
    wave nothing."""
    plain = _budget()
    plain.record(0.012, joined=False)
    assert plain.costs.decode_step.value == pytest.approx(0.011)  # median of 0.010, 0.012
    worked = _budget()
    worked.spend(0.015)
    worked.record(0.030, joined=False)
    assert worked.costs.overrun.value == pytest.approx(0.005)
    assert worked.costs.join_overrun.value is None
    joining = _budget()
    joining.record(0.022, joined=True)
    assert joining.costs.join_overrun.value == pytest.approx(0.012)
    wave = _budget(rows=3, admitting=13)
    wave.spend(0.5)
    wave.record(1.0, joined=True)
    assert wave.costs.overrun.value is None and wave.costs.join_overrun.value is None


def test_joins_are_held_only_after_admission_work_under_a_time_limit() -> None:
    """Invariant: rows whose prefill ends in a step join at the next one only when the step
    worked under a time limit (no wave, not the fixed rule); idle steps never hold them."""
    b = _budget()
    assert not b.holds_joins  # no work yet
    b.spend(0.001)
    assert b.holds_joins
    for other in (_budget(rows=0), _budget(ratio=0), _budget(rows=3, admitting=13)):
        other.spend(0.001)
        assert not other.holds_joins


def test_a_held_join_changes_no_answer_and_happens_at_the_next_step() -> None:
    """Invariant: an image request whose prefill ends while a text row decodes joins the
    batch one step later (the step after its admission work), and its answer and the text
    row's are bit for bit those of an engine that never holds a join."""
    held: list[tuple[bool, int]] = []

    def run(hold: bool) -> tuple[list, list]:
        h = EngineHarness("qwen2_vl", max_batch=4, admission_budget=2.0 if hold else 0)
        batch = h.engine.scheduler.batch
        step = batch.step

        def spy(hold_new: bool = False):  # noqa: ANN202
            out = step(hold_new)
            if hold:
                held.append((batch.joins_pending, batch.last_joined))
            return out

        batch.step = spy
        try:
            text = h.submit(chat_body("count to ten", max_tokens=24, ignore_eos=True))
            with h.arriving_together():
                h.engine.scheduler.costs.decode_step.add(0.005)
                image = noise_image(31, 224, 224)
                img = h.submit(chat_body("what is this?", images=1, max_tokens=6), [image])
            img.wait()
            text.wait()
        finally:
            h.close()
        return [img.token_ids, img.logprobs], [text.token_ids, text.logprobs]

    with_hold, without = run(True), run(False)
    assert with_hold == without
    i = next(i for i, (pending, _) in enumerate(held) if pending)
    assert held[i + 1][1] >= 1  # the held row joined at the next step


def _image_while_decoding(h: EngineHarness, seed: int) -> tuple[object, list[int]]:
    """An image request arriving while a text row decodes; returns its run and the number of
    tower units each encode stage ran."""
    scheduler = h.engine.scheduler
    units: list[int] = []
    step = encode_group.step_group

    def counting(ops, group, budget, free_first=True):  # noqa: ANN001, ANN202
        ran = [0]
        add = budget.costs.add_unit

        def add_unit(key, seconds):  # noqa: ANN001, ANN202
            ran[0] += 1
            add(key, seconds)

        budget.costs.add_unit = add_unit  # an instance attribute, removed below
        try:
            return step(ops, group, budget, free_first)
        finally:
            del budget.costs.add_unit
            units.append(ran[0])

    scheduler_module = "gateway.engine.scheduler.scheduler.step_group"
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(scheduler_module, counting)
        with h.arriving_together():
            scheduler.costs.decode_step.add(0.005)  # the engine is paused: a known estimate
            image = noise_image(seed, 224, 224)
            run = h.submit(chat_body("what is this?", images=1, max_tokens=6), [image])
        run.wait()
    return run, units


@pytest.mark.parametrize("ratio", [1e-6, 2.0, 1000.0])
def test_budgets_size_the_tower_work_and_never_change_an_answer(ratio: float) -> None:
    """Invariant: under any budget, an image answered while a row decodes equals the answer
    of an engine without caches at the old fixed rule, bit for bit; a tiny budget runs one
    tower unit per step, a huge one the whole tower in one step."""
    h = EngineHarness("qwen2_vl", max_batch=4, admission_budget=ratio)
    plain = EngineHarness(
        "qwen2_vl",
        max_batch=4,
        admission_budget=0,
        cache=CacheConfig(vision_enabled=False, prefix_enabled=False),
    )
    forwards = record_prefill_forwards(h.engine.model)
    try:
        _image_while_decoding(h, 17)  # measures the tower units of a 224 px image
        run, units = _image_while_decoding(h, 18)  # another one: sized by the estimates
        reference, _ = _image_while_decoding(plain, 18)
        repeat, _ = _image_while_decoding(h, 18)  # a cache hit now
    finally:
        h.close()
        plain.close()
    for other in (reference, repeat):
        assert run.token_ids == other.token_ids
        assert run.logprobs == other.logprobs
    assert repeat.finish.usage.cached_tokens > 0
    block = h.engine.config.cache.exact_block_tokens(on_gpu=False)
    assert forwards and block_shaped(forwards, block)
    done = [n for n in units if n]
    if ratio < 1:
        assert len(done) >= 5 and max(done) == 1  # 2 embedding pieces, 2 blocks, the merger
    elif ratio >= 1000:  # 5 s against ~ms units
        assert done == [sum(units)]  # all in one step
