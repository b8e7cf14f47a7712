"""The draft lengths speculation picks: the lengths that maximise expected tokens per unit of model work, against a
brute-force search; rests and probes where no draft pays; the timed cost; and what it does to a generation."""

from __future__ import annotations

import itertools
import json
import random

import pytest
import torch

from samplechain.drafters import Drafter
from samplechain.generation import Generation, generate, products
from samplechain.generation import drawing as drawing_module
from samplechain.generation import speculative as speculative_module
from samplechain.generation.draft_length import _OVERHEAD, DraftLengths, width_prices
from samplechain.generation.model import TransformersRunner


def tokens_per_work(rates, costs, lengths, width):
    """Expected tokens of a call (each row's own token and its kept drafts) per unit of its work."""
    kept = sum((1 - a**k) / (1 - a) * a for a, k in zip(rates, lengths))
    return (width + kept) / (width + sum(c * k + _OVERHEAD for c, k in zip(costs, lengths) if k))


def padded_tokens_per_work(rates, cost, ceilings, m, width):
    kept = sum(sum(a**j for j in range(1, min(m, top) + 1)) for a, top in zip(rates, ceilings))
    return (width + kept) / (width + (cost * m + _OVERHEAD) * width if m else width)


def gate(rows, *, cost=None, longest=16, shape="rows", acceptance=None, per_width=False):
    lengths = DraftLengths([longest] * rows, [False] * rows, [cost] * rows, shape)
    lengths.per_width = per_width
    for b, a in enumerate(acceptance or []):
        at_rate(lengths, b, a)
    return lengths


def at_rate(lengths, row, a):
    """Many trials at rate `a`, entering a run and staying in it alike."""
    lengths.keeps[row], lengths.trials[row] = [a * 1000 - 0.5] * 2, [999.0] * 2


@pytest.mark.parametrize("seed", range(40))
def test_one_row_drafts_the_length_that_gives_the_most_tokens_per_work(seed):
    rng = random.Random(seed)
    a, c, top = rng.uniform(0.05, 0.99), rng.choice([0.0, 0.02, 0.1, 0.3, 0.6, 1.2]), rng.randint(1, 20)
    got = gate(1, cost=c, longest=top, acceptance=[a]).limits([0], [top], 1, 1)[0]
    best = max(tokens_per_work([a], [c], [k], 1) for k in range(top + 1))
    if got == 0:  # no draft pays: the row rests (its first call without one)
        assert best == pytest.approx(1.0)
    else:
        assert tokens_per_work([a], [c], [got], 1) == pytest.approx(best, rel=1e-9)


@pytest.mark.parametrize("seed", range(20))
def test_a_batch_gets_the_lengths_a_search_over_all_of_them_finds(seed):
    rng = random.Random(100 + seed)
    rows = rng.randint(2, 3)
    rates = [rng.uniform(0.1, 0.98) for _ in range(rows)]
    costs = [rng.choice([0.05, 0.2, 0.5, 1.0]) for _ in range(rows)]
    lengths = DraftLengths([5] * rows, [False] * rows, costs, "rows")
    for b, a in enumerate(rates):
        at_rate(lengths, b, a)
    got = lengths.limits(list(range(rows)), [5] * rows, rows, rows)
    best = max(tokens_per_work(rates, costs, ks, rows) for ks in itertools.product(range(6), repeat=rows))
    if any(got.values()):
        assert tokens_per_work(rates, costs, [got[b] for b in range(rows)], rows) == pytest.approx(best, rel=1e-9)
    else:
        assert best == pytest.approx(1.0)


@pytest.mark.parametrize("seed", range(20))
def test_a_padded_batch_gets_the_width_a_search_finds(seed):
    rng = random.Random(200 + seed)
    rows = rng.randint(2, 4)
    rates = [rng.uniform(0.1, 0.98) for _ in range(rows)]
    cost, ceilings = rng.choice([0.02, 0.1, 0.3]), [rng.randint(1, 8) for _ in range(rows)]
    lengths = gate(rows, cost=cost, shape="padded", acceptance=rates)
    got = lengths.limits(list(range(rows)), ceilings, rows, rows)
    widths = range(max(ceilings) + 1)
    best = max(padded_tokens_per_work(rates, cost, ceilings, m, rows) for m in widths)
    m = max(got.values())
    if m:
        assert [got[b] for b in range(rows)] == [min(m, top) for top in ceilings]
        assert padded_tokens_per_work(rates, cost, ceilings, m, rows) == pytest.approx(best, rel=1e-9)
    else:
        assert best == pytest.approx(1.0)


def test_longer_drafts_where_acceptance_is_high_and_checking_is_cheap():
    lengths = [
        gate(1, cost=c, longest=64, acceptance=[a]).limits([0], [64], 1, 1)[0]
        for a, c in [(0.95, 0.05), (0.95, 0.6), (0.6, 0.05), (0.3, 0.6)]
    ]
    assert lengths[0] > lengths[1] > 0 and lengths[0] > lengths[2] > 0
    assert lengths[3] == 0


@pytest.mark.parametrize(("cost", "first", "longest"), [(1.0, 20, 64), (0.3, 6, 30), (0.02, 1, 4)])
def test_a_row_no_draft_pays_for_rests_between_probes_that_double_while_they_miss(cost, first, longest):
    """The rests scale with what a probe costs: the first makes it about 5% of the work, the longest about 1%."""
    lengths = gate(1, cost=cost, acceptance=[0.01])
    schedule = []
    for _ in range(400):
        k = lengths.limits([0], [16], 1, 1)[0]
        schedule.append(k)
        if k:
            lengths.checked(0, False)
    probes = [i for i, k in enumerate(schedule) if k]
    assert all(schedule[i] == 1 for i in probes)
    assert probes[0] == first + 1  # the call that found no draft paying, then `first` calls of rest
    gaps = [b - a - 1 for a, b in itertools.pairwise(probes)]
    assert gaps[:6] == [min(first * 2**i, longest) for i in range(1, 7)], schedule


def test_a_rest_begun_while_probes_looked_cheap_grows_to_what_they_are_timed_to_cost():
    """Before any draft is timed a probe looks cheap and the first rest is short; a probe that then misses rests
    the first rest at the cost timed since (about 5% of the work), not twice the short one."""
    lengths = gate(1, acceptance=[0.01])
    lengths._unit = lambda width, held: (0.02, 0.0)  # type: ignore[method-assign]
    schedule = []
    for call in range(120):
        if call == 2:  # drafting calls timed: a probe costs a whole call
            lengths._unit = lambda width, held: (1.0, 0.0)  # type: ignore[method-assign]
        k = lengths.limits([0], [16], 1, 1)[0]
        schedule.append(k)
        if k:
            lengths.checked(0, False)
    probes = [i for i, k in enumerate(schedule) if k]
    assert probes[:3] == [2, 23, 64], schedule  # rests of 1 (the prior's), then 20 and 40 (the timed cost's)


def test_a_probe_that_is_kept_keeps_the_row_probing_and_acceptance_decides_again():
    lengths = gate(1, cost=0.3)
    for _ in range(5):  # misses: acceptance falls, the row rests
        lengths.checked(0, False)
    schedule = [lengths.limits([0], [16], 1, 1)[0] for _ in range(8)]
    assert schedule == [0] * 7 + [1]  # rests 6 calls, then probes
    kept = 0
    for _ in range(30):
        lengths.checked(0, True)
        kept = lengths.limits([0], [16], 1, 1)[0]
    assert kept > 3, "a run of kept probes brings longer drafts back"
    assert lengths.pause[0] == 0


@pytest.mark.parametrize(("c", "step", "longer"), [(0.02, 0.6, True), (0.6, 0.2, False)])
def test_a_probe_is_as_long_as_a_draft_would_pay_at_the_prior_acceptance(c, step, longer):
    """Where a call pays a step for drafting at all and little per drafted token, a probe costs about as much at
    any length, and a long one can keep a run whole; where each drafted token costs, one token."""
    lengths = gate(1, longest=10)
    lengths._unit = lambda width, held: (c, step)  # type: ignore[method-assign]
    # drafts that missed at their first token; within a run, high acceptance
    lengths.keeps[0], lengths.trials[0] = [0.0, 90.0], [20.0, 100.0]
    schedule = [lengths.limits([0], [10], 1, 1)[0] for _ in range(80)]
    probe = next(k for k in schedule if k)
    assert schedule.index(probe) > 1, "the row rests before it probes"
    assert (probe > 1) is longer
    assert lengths.probing[0]


def batch_seconds(rates, left, m, fit):
    """The seconds a padded batch's calls take until every row has its `left` tokens, each call drafting m tokens a
    row (a row gains its own token and, in expectation, its kept ones), rows leaving once done: called out call by
    call."""
    alpha, beta, step = fit
    gain = [1 + sum(a**j for j in range(1, m + 1)) for a in rates]
    done, seconds = [0.0] * len(rates), 0.0
    while True:
        going = [i for i, n in enumerate(left) if done[i] < n - 1e-9]
        if not going:
            return seconds
        # the last call of a row: the share of it the row still needs, as a row counts calls in fractions
        share = min(1.0, min((left[i] - done[i]) / gain[i] for i in going))
        call = alpha + beta * len(going) * (1 + m) + (step + _OVERHEAD * (alpha + beta * len(going)) if m else 0.0)
        seconds += share * call
        for i in going:
            done[i] += share * gain[i]


@pytest.mark.parametrize("seed", range(20))
def test_a_padded_batch_drafts_the_width_with_which_its_slowest_row_is_done_soonest(seed):
    """Every row of a padded batch pays the widest draft's columns, and the batch calls until its slowest row is
    done: the common width is the one with which the calls take the least time in all, not the one with the most
    tokens a call."""
    rng = random.Random(300 + seed)
    rows = rng.randint(2, 6)
    rates = [rng.choice([rng.uniform(0.05, 0.4), rng.uniform(0.8, 0.98)]) for _ in range(rows)]
    left = [rng.randint(20, 200) for _ in range(rows)]
    fit = (rng.uniform(0.03, 0.1), rng.uniform(0.0005, 0.005), rng.uniform(-0.01, 0.01))
    lengths = gate(rows, longest=10, shape="padded", acceptance=rates)
    lengths._fitted = lambda signed=False: fit if signed else (*fit[:2], max(fit[2], 0.0))  # type: ignore[method-assign]
    got = lengths.limits(list(range(rows)), [n - 1 for n in left], rows, rows)
    m = max(got.values())
    times = [batch_seconds(rates, left, w, fit) for w in range(11)]
    if m:
        assert [got[b] for b in range(rows)] == [min(m, n - 1) for n in left]
        fastest = min(range(11), key=times.__getitem__)
        # a batch whose rows' records say draft drafts at least one token
        assert m == max(fastest, 1) or times[m] == pytest.approx(times[fastest], rel=1e-6)
    else:  # no draft pays on the rows' records: they rest
        assert lengths.idle == [lengths.pause[0]] * rows


def test_one_slow_row_keeps_a_padded_batch_to_short_drafts():
    """Three rows that copy and one that mostly misses: the copying rows would make the most tokens a call with long
    drafts, but the batch calls until the slow row is done, so each call drafts short; without the slow row, long."""
    fit = (0.08, 0.002, 0.0)

    def width(rates):
        lengths = gate(len(rates), longest=10, shape="padded", acceptance=rates)
        lengths._fitted = lambda signed=False: fit  # type: ignore[method-assign]
        return max(lengths.limits(list(range(len(rates))), [127] * len(rates), len(rates), len(rates)).values())

    assert width([0.9, 0.9, 0.9, 0.2]) <= 2
    assert width([0.9, 0.9, 0.9, 0.9]) >= 6


def test_on_a_padded_batch_a_resting_row_drafts_as_wide_as_the_call_for_free():
    lengths = gate(3, cost=0.1, shape="padded", acceptance=[0.95, 0.01, 0.01])
    lengths.timed(3, 0.03)  # a lookup's drafts: next to no time of the drafter's own
    lengths.idle[1] = lengths.idle[2] = lengths.pause[1] = lengths.pause[2] = 5
    got = lengths.limits([0, 1, 2], [16, 3, 16], 3, 3)
    assert got[0] > 3 and got[1] == 3 and got[2] == got[0]  # as wide as row 0, within each row's room
    assert lengths.riding == [False, True, True]
    lengths.checked(1, True)  # a kept ride ends the rest
    lengths.checked(2, False)  # a missed one costs nothing: the rest goes on, not doubled
    assert (lengths.idle[1], lengths.idle[2], lengths.pause[2]) == (0, 4, 5)
    rows = gate(3, cost=0.1, shape="rows", acceptance=[0.95, 0.01, 0.01])  # each row its own width: no rides
    rows.timed(3, 0.03)
    rows.idle[1] = rows.idle[2] = 5
    assert [rows.limits([0, 1, 2], [16, 16, 16], 3, 3)[b] for b in (1, 2)] == [0, 0]
    costly = gate(3, cost=0.1, shape="padded", acceptance=[0.95, 0.01, 0.01])  # a model drafter's own passes
    costly.timed(3, 0.03)
    costly.drafted(10, 0.05)
    costly.idle[1] = costly.idle[2] = 5
    assert [costly.limits([0, 1, 2], [16, 16, 16], 3, 3)[b] for b in (1, 2)] == [0, 0]


def test_fixed_rows_draft_their_longest_and_the_room_bounds_every_row():
    lengths = DraftLengths([6, 6], [True, False], [None, 0.0], "rows")
    at_rate(lengths, 1, 0.9)
    assert lengths.limits([0, 1], [10, 10], 2, 2) == {0: 6, 1: 6}
    assert lengths.limits([0, 1], [3, 0], 2, 2) == {0: 3, 1: 0}


def test_the_timed_cost_is_the_fitted_cost_of_a_drafted_token_and_of_drafting_at_all():
    lengths = gate(1)
    assert lengths._unit(1, 1) == pytest.approx((0.25, 0.0))  # nothing timed yet
    ks = [0, 3, 1, 8, 0, 5, 2, 7] * 3

    def time(f, k):  # 10 ms, 2 ms a token, 6 ms more for a call with drafts
        return 0.010 + 0.002 * f + 0.006 * (k > 0)

    for k in ks:
        lengths.timed(1 + k, time(1 + k, k), k > 0)
    # the fit leans a little toward its priors: the slope to c = 0.25, the step (seen in few calls) to none
    near = {"rel": 0.02}

    def fitted(got, c, step):
        assert got[0] == pytest.approx(c, **near) and got[1] == pytest.approx(step, rel=0.15)

    fitted(lengths._unit(1, 1), 0.002 / 0.012, 0.006 / 0.012)
    batch = gate(4)
    for k in ks:
        batch.timed(4 + k, time(4 + k, k), k > 0)
    fitted(batch._unit(4, 4), 0.002 * 4 / 0.018, 0.006 * 4 / 0.018)  # per row of a 4-row call
    padded = gate(4, shape="padded")
    for m in ks:
        padded.timed(4 * (1 + m), time(4 * (1 + m), m), m > 0)
    fitted(padded._unit(4, 4), 0.008 / 0.018, 0.006 * 4 / 0.018)  # a drafted column: every held row
    padded.drafted(8, 0.008)
    fitted(padded._unit(4, 4), (0.008 + 0.001 * 4) / 0.018, 0.006 * 4 / 0.018)


@pytest.mark.parametrize(("a", "short", "stepped"), [(0.7, 4, 3), (0.97, 10, 10)])
def test_one_row_drafts_short_of_the_width_where_its_calls_were_timed_to_step_up(a, short, stepped):
    """Calls of up to four tokens taking one token's time and longer ones half as much again (a runner that
    multiplies a few rows as fast as one): a row whose drafts are kept 70% of the time drafts three tokens, where
    calls growing evenly with their tokens have it draft more; at 97% a long draft pays even past the step."""

    def drafts_at(seconds):
        lengths = gate(1, longest=10, acceptance=[a], per_width=True)
        for k in [0, 3, 1, 8, 0, 5, 2, 7, 10, 4, 6, 9] * 4:
            lengths.timed(1 + k, seconds(1 + k), k > 0)
        return lengths.limits([0], [10], 1, 1)[0]

    even = drafts_at(lambda f: 0.010 + 0.001 * (f - 1))
    assert even >= short
    assert drafts_at(lambda f: 0.010 if f <= 4 else 0.015 + 0.0005 * f) == stepped


def test_a_width_never_timed_is_tried_at_the_price_of_the_narrower_ones():
    """One-token calls timed at 10 ms and one call of eleven tokens at 18 ms (a first draft as long as it could be):
    a row keeping 30% of its drafts drafts one token where every width is priced on the line through those calls.
    Priced as the narrower ones (a runner with `stepped_widths`), the widths in between are tried; once each was
    timed at what it takes (one token's time up to four tokens, then a step), the row settles on three tokens, the
    widest at one token's price. A next generation given the same record of width prices (the model's,
    `width_prices`) drafts three tokens from its first call, and so does one in a next process given their ratios to
    a one-token call (`kept`, as a runner keeps them: `ModelRunner.kept_widths`), on a host running at another
    speed."""

    def seconds(f):
        return 0.010 if f <= 4 else 0.016 + 0.0002 * f

    def choices(widths):
        lengths = gate(1, longest=10, acceptance=[0.3], per_width=True)
        lengths.widths = widths
        for _ in range(20):
            lengths.timed(1, 0.010)
        lengths.timed(11, 0.018, True)
        chosen = []
        for _ in range(16):
            k = lengths.limits([0], [10], 1, 1)[0]
            chosen.append(k)
            lengths.timed(1 + k, seconds(1 + k), k > 0)
        return chosen

    shared: dict[int, list[float]] = {}
    chosen = choices(shared)
    assert chosen[0] > 3  # an untimed width, priced as one token's call
    assert sorted(set(chosen[:8])) == list(range(3, chosen[0] + 1))  # each wider width tried, once, down to the step
    assert chosen[8:] == [3] * 8
    assert choices(shared) == [3] * 16
    fresh = gate(1, longest=10, acceptance=[0.3], per_width=True)
    fresh.widths = shared
    ratios = fresh.width_ratios()
    assert ratios[4] == pytest.approx(1.0, abs=0.01) and ratios[5] == pytest.approx(1.7, abs=0.05)
    assert set(ratios) == {11, *range(4, chosen[0] + 2)}  # the widths timed, past one token
    slower = gate(1, longest=10, acceptance=[0.3], per_width=True)
    slower.kept = ratios
    for _ in range(20):
        slower.timed(1, 0.013)  # this process's one-token calls: 30% slower
    slower.timed(11, 0.018 * 1.3, True)
    assert slower.limits([0], [10], 1, 1)[0] == 3
    linear = gate(1, longest=10, acceptance=[0.3])
    for _ in range(20):
        linear.timed(1, 0.010)
    linear.timed(11, 0.018, True)
    assert linear.limits([0], [10], 1, 1)[0] == 1


def test_a_kept_width_price_is_at_most_the_fitted_lines():
    """A width an earlier process kept at 1.1 one-token calls is priced so; one kept at 40 (one slow call, on a busy
    host) at most at the fitted line's price of a call with drafts, so that the width is still drafted where that
    pays, and timed again."""
    lengths = gate(1, longest=10, per_width=True)
    for _ in range(20):
        lengths.timed(1, 0.010)
    alpha, beta, step = fit = lengths._fitted()
    lengths.kept = {4: 1.1, 11: 40.0}
    priced = lengths._priced(11, fit, 1)
    assert priced[1] == pytest.approx(0.010) and priced[4] == pytest.approx(1.1 * priced[1])
    assert priced[11] == pytest.approx(alpha + 11 * beta + step) and priced[11] < 5 * priced[1]


def test_what_a_draft_costs_outlasts_the_plain_calls_of_a_rest():
    """A row that rests runs one-token calls only; the fit keeps what the calls with drafts before it cost, so the
    probe after the rest is priced as timed (not at the prior's c = 0.25 and no step)."""
    lengths = gate(1)

    def time(f, k):
        return 0.010 + 0.002 * f + 0.006 * (k > 0)

    for k in [0, 3, 1, 8, 0, 5, 2, 7] * 3:
        lengths.timed(1 + k, time(1 + k, k), k > 0)
    before = lengths._unit(1, 1)
    for _ in range(40):
        lengths.timed(1, time(1, 0))
    c, step = lengths._unit(1, 1)
    assert c == pytest.approx(before[0], rel=0.05) and step == pytest.approx(before[1], rel=0.15)
    assert step > 0.4  # 6 ms of a 12 ms call


def test_without_a_step_the_fit_finds_none_and_a_call_that_always_drafts_puts_its_step_in_the_intercept():
    steady = gate(1)
    for k in [0, 3, 1, 8, 0, 5, 2, 7] * 3:
        steady.timed(1 + k, 0.010 + 0.002 * (1 + k), k > 0)
    assert steady._unit(1, 1)[1] == pytest.approx(0.0, abs=0.01)
    always = gate(1)
    for k in [3, 1, 8, 5, 2, 7] * 3:
        always.timed(1 + k, 0.016 + 0.002 * (1 + k), True)
    assert always._unit(1, 1) == pytest.approx((0.002 / 0.018, 0.0), abs=0.01)


@pytest.mark.parametrize("seed", range(30))
def test_with_a_step_a_row_drafts_the_length_a_search_finds_or_none(seed):
    """Where any draft makes the call a many-token pass that costs a step more (s), a row drafts the k that
    maximises (1 + kept) / (1 + s + c k + overhead), or none where no k beats 1."""
    rng = random.Random(300 + seed)
    a, c, s, top = rng.uniform(0.05, 0.99), rng.choice([0.0, 0.02, 0.1, 0.3]), rng.uniform(0.0, 1.0), rng.randint(1, 16)
    lengths = gate(1, longest=top, acceptance=[a])
    lengths._unit = lambda width, held: (c, s)  # type: ignore[method-assign]
    got = lengths.limits([0], [top], 1, 1)[0]

    def ratio(k):
        kept = sum(a**j for j in range(1, k + 1))
        return (1 + kept) / (1 + s + c * k + _OVERHEAD) if k else 1.0

    best = max(ratio(k) for k in range(top + 1))
    if got == 0:
        assert best == pytest.approx(1.0)
    else:
        assert ratio(got) == pytest.approx(best, rel=1e-9)


def test_the_state_survives_a_checkpoint():
    lengths = gate(2, cost=0.3)
    lengths.limits([0, 1], [8, 8], 2, 2, [None, ("ngram1", 0.2)].__getitem__)
    for kept in [True, False, False, True]:
        lengths.checked(1, kept)
    lengths.limits([0, 1], [8, 8], 2, 2)
    again = gate(2, cost=0.3)
    again.restore(lengths.checkpoint())
    assert again.checkpoint() == lengths.checkpoint()
    assert again.limits([0, 1], [8, 8], 2, 2) == lengths.limits([0, 1], [8, 8], 2, 2)


class Wrong(Drafter):
    """Guesses the newest token's successor in the vocabulary, over and over: on the tiny model's greedy text,
    every guess misses."""

    name = "wrong"

    def propose(self, row, tokens, limit):
        return [(int(tokens[-1]) + 1) % 1000] * limit


def test_a_drafter_that_always_misses_drafts_rarely_where_checking_costs(tiny_lm):
    model, tok = tiny_lm
    counts = {}
    for cost in (0.0, 0.5):
        gen = Generation(
            model,
            tok,
            ["The cat sat on"],
            pad_token_id=0,
            chain="preset:greedy",
            max_new_tokens=40,
            ignore_eos=True,
            draft={"use": Wrong(), "cost": cost},
        )
        for _ in gen.steps():
            pass
        out = gen.output()
        assert out.model_calls.tolist() == out.num_generated.tolist()  # one token per call: nothing kept
        counts[cost] = int(out.drafted[0])
    assert 0 < counts[0.5] < counts[0.0] / 4, counts  # free checks: a draft every call; costly: probes backing off


def test_a_row_in_a_run_of_kept_tokens_drafts_long_and_one_that_just_missed_does_not():
    """Acceptance comes in runs (a copied passage, then text of the model's own): a draft's first token after a kept
    one is kept about as often as any token in a run, after a miss about as often as a run begins."""

    def row(streak):
        lengths = gate(1, cost=0.3)
        lengths.keeps[0], lengths.trials[0] = [0.5, 19.0], [9.5, 19.5]  # a run begins 1 time in 10, goes on 97 in 100
        lengths.streak[0] = streak
        return lengths

    assert row(True).limits([0], [16], 1, 1)[0] >= 8
    assert row(False).limits([0], [16], 1, 1)[0] == 0
    missed = row(False)
    missed.checked(0, True)  # a guess kept: in a run again
    assert missed.streak[0] and missed.limits([0], [16], 1, 1)[0] >= 8
    missed.undrafted(0)  # a call without a draft: the next one begins a run
    assert not missed.streak[0]


def test_the_work_of_a_call_follows_how_the_runner_feeds_its_rows():
    assert gate(3).work([1, 4, 2], 5) == 7  # each row its own tokens
    assert gate(3, shape="padded").work([1, 4, 2], 5) == 20  # every held row as wide as the widest
    assert gate(3, shape="together").work([3, 3, 3], 3) == 9


def test_a_row_keeps_a_record_per_kind_of_draft_its_drafter_tells_apart():
    """A drafter that knows its good guesses from its poor ones (prompt lookup: a long match from a one-token one)
    names their kind; a row entering a run drafts by that kind's record, begun at the drafter's prior."""
    lengths = gate(1, cost=0.1)
    lengths.keeps[0], lengths.trials[0] = [0.0, 19.0], [1.0, 19.5]  # the row has drafted: no hopeful first draft
    for _ in range(30):  # one-token matches miss, three-token ones are kept
        for kind, kept in (("ngram1", False), ("ngram3", True)):
            lengths.limits([0], [16], 1, 1, lambda b, kind=kind: (kind, 0.5))
            lengths.streak[0], lengths.idle[0], lengths.pause[0] = False, 0, 0
            lengths.checked(0, kept)
    lengths.streak[0] = False
    assert lengths.limits([0], [16], 1, 1, lambda b: ("ngram3", 0.5))[0] >= 8
    assert lengths.limits([0], [16], 1, 1, lambda b: ("ngram1", 0.5))[0] == 0
    assert lengths.kinds[0]["ngram1"][0] == 0 and lengths.kinds[0]["ngram3"][0] > 10
    fresh = gate(1, cost=0.1)  # a kind never seen starts at the drafter's prior
    fresh.keeps[0], fresh.trials[0] = [0.0, 19.0], [1.0, 19.5]
    fresh.limits([0], [16], 1, 1, lambda b: ("ngram3", 0.9))
    assert fresh.acceptance(0)[0] == pytest.approx(0.9)


@pytest.mark.parametrize(("prior", "hopeful"), [(0.52, True), (0.9, True), (0.5, False), (0.2, False), (None, False)])
def test_a_first_draft_the_drafter_expects_kept_is_as_long_as_it_can_be_and_a_probe(prior, hopeful):
    lengths = gate(1, cost=0.25, longest=10)
    kind = None if prior is None else ("ngram2", prior)
    got = lengths.limits([0], [16], 1, 1, lambda b: kind)[0]
    assert (got == 10) == hopeful
    if hopeful:
        lengths.checked(0, False)  # missed: the row rests as after a probe
        assert lengths.idle[0] > 0
        assert lengths.limits([0], [16], 1, 1, lambda b: kind)[0] == 0
    after = gate(1, cost=0.25, longest=10)
    after.checked(0, True)  # a row that has drafted before drafts by its record
    assert after.limits([0], [16], 1, 1, lambda b: kind)[0] < 10


def back_from_rest(cost, kind):
    """A row whose drafts of `kind` (and its first tokens) missed five times, so that no draft pays by its record,
    and which rested: its next call, the rest over, with a draft of that kind."""
    lengths = gate(1, cost=cost, longest=10)
    lengths.keeps[0], lengths.trials[0] = [0.0, 0.0], [5.0, 0.0]
    if kind is not None:
        lengths.kinds[0][kind[0]] = [0.0, 5.0, kind[1]]
    lengths.pause[0], lengths.idle[0] = 4, 0
    return lengths, lengths.limits([0], [16], 1, 1, lambda b: kind)[0]


@pytest.mark.parametrize(("cost", "kind", "probes"), [
    (0.6, None, True),  # no kind named: a one-token probe at the prior 1/2, however dear
    (0.3, ("ngram2", 0.52), True),
    (0.6, ("ngram2", 0.52), False),  # a drafted token dearer than a kept one at the prior 1/2 is worth
    (0.3, ("ngram1", 0.15), False),  # would not pay at its prior where a drafted token costs 0.3 of a call
    (0.05, ("ngram1", 0.15), True),  # does where checking is cheap
])  # fmt: skip
def test_a_row_back_from_a_rest_probes_only_with_a_kind_of_draft_that_would_pay_at_its_prior(cost, kind, probes):
    lengths, got = back_from_rest(cost, kind)
    assert (got > 0) is probes and lengths.probing[0] is probes
    if not probes:  # nothing measured: the rest goes on as long again, and the row is not asked meanwhile
        assert (lengths.pause[0], lengths.idle[0]) == (4, 4)
        asked = []
        for _ in range(4):
            assert lengths.limits([0], [16], 1, 1, lambda b: asked.append(b))[0] == 0
        assert not asked


@pytest.mark.parametrize("shape", ["rows", "padded"])
def test_a_hopeful_first_draft_is_drafted_on_a_call_of_one_row_only(shape):
    alone = gate(1, cost=0.25, longest=10, shape=shape)
    assert alone.limits([0], [16], 1, 1, lambda b: ("ngram2", 0.9))[0] == 10
    # in a batch it would widen the other rows, or make every row's plain step a checking call
    batch = gate(2, cost=0.25, longest=10, shape=shape)
    assert batch.limits([0, 1], [16, 16], 2, 2, [("ngram2", 0.9), None].__getitem__)[0] < 10


def test_a_resting_row_is_not_asked_what_kind_its_next_draft_is():
    lengths = gate(2, cost=0.3)
    lengths.idle[1] = 3
    asked = []
    lengths.limits([0, 1], [8, 8], 2, 2, lambda b: asked.append(b))
    assert asked == [0]


@pytest.mark.parametrize("shape", ["rows", "padded"])
def test_calls_timed_at_no_time_give_finite_costs(shape):
    """A coarse clock can time every call at 0 s: the fit's call time is then 0, and the costs stay finite."""
    lengths = gate(2, shape=shape)
    for k in [0, 3, 1, 8, 0, 5] * 3:
        lengths.timed(2 * (1 + k), 0.0, k > 0)
    c, step = lengths._unit(2, 2)
    assert c >= 0 and step >= 0 and c < float("inf") and step < float("inf")


@pytest.mark.parametrize("products", [True, False])
def test_the_loop_prices_per_width_on_a_runner_whose_calls_step_up(tiny_lm, monkeypatch, products):
    """The transformers runner on a CPU with MKL runs checks of a few tokens in its few-row products, so its calls'
    time steps up (`stepped_widths`), and the loop prices one row's drafts per width, in the model's record of width
    prices, which its next generation starts from; with the model's own products, on the fitted line."""
    seen = []
    limits = DraftLengths.limits

    def spy(self, *args, **kwargs):
        seen.append((self.per_width, self.widths))
        return limits(self, *args, **kwargs)

    monkeypatch.setattr(DraftLengths, "limits", spy)
    monkeypatch.setattr(TransformersRunner, "few_row_products", products)
    model, tok = tiny_lm
    width_prices(model).clear()
    for _ in range(2):
        generate(model, tok, ["one two three one two three one two"], draft="prompt_lookup", max_new_tokens=8)
    stepped = products and torch.backends.mkl.is_available()
    assert seen and {per_width for per_width, _ in seen} == {stepped}
    assert all((widths is width_prices(model)) == stepped for _, widths in seen)
    assert bool(width_prices(model)) == stepped  # the widths timed, kept for the model's next generation


@pytest.mark.skipif(not torch.backends.mkl.is_available(), reason="the few-row products need MKL")
def test_a_process_keeps_its_width_prices_and_the_next_one_starts_from_them(tiny_lm, monkeypatch, tmp_path):
    """A speculative generation on a runner whose calls step up keeps its widths' prices, as ratios to a one-token
    call, with the model's layouts on the machine (products.KeptLayouts); a next process (the model's layouts and
    width prices not yet known to it) prices the widths it has not timed by them from its first call."""
    file = tmp_path / "layouts.json"
    monkeypatch.setenv("SAMPLECHAIN_LAYOUTS", str(file))
    monkeypatch.setattr(TransformersRunner, "few_row_products", True)
    seen = []
    limits = DraftLengths.limits

    def spy(self, *args, **kwargs):
        seen.append(dict(self.kept))
        return limits(self, *args, **kwargs)

    monkeypatch.setattr(DraftLengths, "limits", spy)
    model, tok = tiny_lm
    prompt = ["one two three four one two three four one two three four one two"]
    for process in range(2):
        # a process that has not met the model yet (the session's record of its layouts comes back after the test)
        monkeypatch.delitem(products._layouts, model, raising=False)
        width_prices(model).clear()
        seen.clear()
        generate(model, tok, prompt, draft="prompt_lookup", max_new_tokens=12, seed=1)
        if not process:
            assert seen and seen[0] == {}
            (record,) = json.loads(file.read_text()).values()
            kept = {int(f): ratio for f, ratio in record["widths"].items()}
    assert kept and all(f >= 2 and ratio > 0 for f, ratio in kept.items())
    assert seen and seen[0] == kept


def test_the_loop_leaves_a_runners_one_time_work_out_of_the_calls_it_prices(tiny_lm, monkeypatch):
    """A runner's first call of a kind can carry one-time work (the transformers runner timing its layouts); it
    counts it in `ModelRunner.untimed`, and the draft lengths see each call's time without it: here every call of
    several tokens takes 5 s more on the clock, all of it one-time work."""
    now = [0.0]
    clock = type("Clock", (), {"perf_counter": staticmethod(lambda: now[0])})
    monkeypatch.setattr(speculative_module, "time", clock)
    monkeypatch.setattr(drawing_module, "time", clock)
    forward = TransformersRunner._forward
    checks = []

    def slow(self, ids, next_len, keep=1):
        if keep > 1:  # a check
            checks.append(keep)
            now[0] += 5.0 + 0.01
            self.untimed += 5.0
        return forward(self, ids, next_len, keep)

    monkeypatch.setattr(TransformersRunner, "_forward", slow)
    seen = []
    timed = DraftLengths.timed

    def spy(self, fed, seconds, *args):
        seen.append(seconds)
        return timed(self, fed, seconds, *args)

    monkeypatch.setattr(DraftLengths, "timed", spy)
    model, tok = tiny_lm
    generate(model, tok, ["one two three"], draft=Wrong(), max_new_tokens=8, do_sample=False)
    assert checks and len(seen) >= len(checks)
    assert all(0 <= s < 1 for s in seen), seen
