"""Composition fuzzing: random chains of the whole catalogue on adversarial logits, against invariants and a
stage-by-stage reference.

A case is a chain of 1-6 entries drawn from every transform and filter registered (any order, repeats under
distinct ids), parameters drawn inside their schemas' ranges (disabling values included), then one selector
(greedy, dist, mirostat, mirostat_v2, adaptive_p); a batch of B = 1-16 rows, each a request with its own
parameters for every entry and its own seed; each row's logits of its own kind: normal, flat (all equal), peaked,
rounded through bfloat16 (ties everywhere), with -inf holes, a single finite entry, or huge finite values;
V from 2 to 50,000 (a fifth of the cases wider than `filters.WIDE`, so the wide-row paths run too). A token
history and unconditional logits go with every case; chains with grammar or infill use a real byte-level BPE
tokenizer (V = its vocabulary).

Invariants of every case (the test names them in its failure message):
- errors: anything raised is a samplechain error; one of a step names the culprit (the sampler and, for a row
  left with nothing, the request). A row with a finite logit is left with no candidate only by a sampler whose
  role is a mask or a bias (banning tokens is what they are for); a truncation never empties a row.
- `process()` equals `sample(return_scores=True).scores`, bitwise, and the sampled token is one it keeps;
  greedy takes the processed row's maximum (of equal maxima, the lowest id);
- stage by stage: every entry run alone, on the (B, V) scores the previous ones left (removed tokens -inf, the
  full vocabulary again), keeps the same candidates, and the selector alone on the result draws the same
  tokens: compaction, sortedness and the executor's fusions change nothing;
- batch invariance: each row run alone keeps the same candidates (bitwise) and draws the same seeded token.

Two tests, 1,500 derandomized examples each in CI (about 4 minutes together on 2 cores; marked slow):
`test_random_compositions` (the whole catalogue) and `test_random_truncation_chains` (the truncating filters and
temperature only, where compaction and sortedness interact most: it finds the emptied row of
test_composition_defects.py, [top_n_sigma, typical, top_k 1], when that fix is undone). A third,
`test_random_sync_free_chains` (a fifth as many examples), runs chains of the samplers that declare a sync-free
step on the cuda backend's logic (CPU tensors, under `no_host_sync`) against the cpu backend: the same tokens or
the same error. `SAMPLECHAIN_FUZZ_EXAMPLES=N` runs N each, `SAMPLECHAIN_FUZZ_SEED=S` a
fresh random sequence instead of the fixed one. A failure prints the case; `check(eval(printed_case))` replays it.
"""

from __future__ import annotations

import functools
import os
import re
import warnings
from collections.abc import Mapping, Sequence
from typing import Any

import attrs
import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, seed, settings
from hypothesis import strategies as st

from samplechain import Chain, Stage, get_host
from samplechain import filters as sc_filters
from samplechain.engine.store import _DTYPES
from samplechain.errors import SamplechainError, SamplingError
from samplechain.params import field_type, is_seed_field, validators
from samplechain.tools.testing import byte_bpe_tokenizer

NEG_INF = float("-inf")
EXAMPLES = int(os.environ.get("SAMPLECHAIN_FUZZ_EXAMPLES", "1500"))  # per test
_SEED = os.environ.get("SAMPLECHAIN_FUZZ_SEED")
FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=_SEED is None,
    database=None,
    suppress_health_check=list(HealthCheck),
)

SELECTORS = ("greedy", "dist", "mirostat", "mirostat_v2", "adaptive_p")
# samplers whose semantics need a tokenizer: a case with one of them runs on the tokenizer's vocabulary
NEEDS_TOKENIZER = frozenset({"grammar", "infill"})
# roles allowed to leave a row with nothing: they remove particular tokens whatever their probability
MAY_EMPTY = frozenset({"mask", "bias"})
ALWAYS = frozenset(
    {("grammar", "gbnf"), ("reasoning_budget", "start_ids"), ("reasoning_budget", "end_ids")}
)  # optional fields of which a valid entry needs one
CHAIN_LEVEL = frozenset({("grammar", "json")})  # stored per request, but part of the compiled grammar
KINDS = ("normal", "flat", "peaked", "bf16", "holes", "single", "huge")


@functools.cache
def tokenizer() -> Any:
    return byte_bpe_tokenizer(300)


@functools.cache
def catalogue() -> dict[str, type]:
    """Every registered transform and filter (newest version), by name."""
    host = get_host()
    host.load_all()
    out = {}
    for name, versions in sorted(host.registered("sampler").items()):
        cls = versions[max(versions)]
        if cls.stage is not Stage.SELECT:
            out[name] = cls
    return out


# ----------------------------------------------------------------- parameters, from the schemas
def _numeric(field: attrs.Attribute) -> st.SearchStrategy[Any]:
    """Values inside the field's declared range (its bounds included: disabling values usually sit there)."""
    low = high = None
    low_open = high_open = False
    for v in validators(field):
        if hasattr(v, "choices"):  # params.one_of
            return st.sampled_from(v.choices)
        if hasattr(v, "bounds"):  # params.in_range
            low, high, low_open, high_open = v.bounds
    kind = field_type(field)
    if kind is bool:
        return st.booleans()
    span = 4.0 if kind is float else 64  # unbounded sides: a span around the bound, or [-4, 4] with neither
    lo = (-span if high is None else high - span) if low is None else low
    hi = (span if low is None else lo + span) if high is None else min(high, lo + 1e6)
    if kind is int:
        lo, hi = int(lo) + (1 if low_open else 0), int(hi) - (1 if high_open else 0)
        return st.one_of(st.sampled_from([lo, hi]), st.integers(lo, hi))
    edges = [e for e, is_open in ((lo, low_open), (hi, high_open)) if not is_open]
    lo, hi = _inside(lo, np.inf), _inside(hi, -np.inf)
    inner = st.floats(lo, hi, exclude_min=low_open, exclude_max=high_open, width=32, allow_subnormal=False)
    return st.one_of(st.sampled_from(edges), inner) if edges else inner


def _inside(bound: float, toward: float) -> float:
    """The float32 nearest to bound, moved toward `toward` when rounding took it outside the range."""
    near = np.float32(bound)
    outside = float(near) < bound if toward > 0 else float(near) > bound  # compared in float64 (NEP 50)
    return float(np.nextafter(near, np.float32(toward)) if outside else near)


def _f32(low: float, high: float) -> st.SearchStrategy[float]:
    return st.floats(float(np.float32(low)), float(np.float32(high)), width=32, allow_subnormal=False)


def _ids(vocab: int, low: int = 0, high: int = 6) -> st.SearchStrategy[list[int]]:
    return st.lists(st.integers(0, vocab - 1), min_size=low, max_size=high)


def _special(name: str, field: str, vocab: int) -> st.SearchStrategy[Any] | None:
    """Fields whose range depends on the vocabulary, or that are not numbers (token-id lists, bias tables,
    grammars); None: drawn from the schema."""
    ids = _ids(vocab)
    seqs = st.lists(_ids(vocab, 1, 3).map(tuple), max_size=4)
    bias = st.one_of(st.just(NEG_INF), _f32(-100, 100))
    table = {
        ("top_k", "k"): st.one_of(st.sampled_from([-1, 0, 1, 2, vocab]), st.integers(-1, min(vocab + 2, 80))),
        ("temperature", "t"): st.one_of(st.sampled_from([0.0, 1.0]), _f32(0.05, 4.0)),
        ("temp_ext", "t"): st.one_of(st.sampled_from([0.0, 1.0]), _f32(0.05, 4.0)),
        ("forced_bos", "bos_id"): st.integers(-1, vocab - 1),
        ("infill", "eot_id"): st.integers(-1, vocab - 1),
        ("logit_bias", "bias"): st.dictionaries(st.integers(0, vocab - 1).map(str), bias, max_size=5),
        ("sequence_bias", "bias"): st.lists(st.tuples(_ids(vocab, 1, 3), bias).map(list), max_size=4),
        ("bad_words", "ids"): seqs,
        ("bad_words", "words"): st.just(()),
        ("dry", "breakers"): st.just(()),  # strings need the tokenizer: given as ids instead
        ("dry", "breaker_ids"): seqs,
        ("grammar", "gbnf"): st.sampled_from(['root ::= "a"+ | "b" [0-9]*', 'root ::= [a-z]+ " " [a-z]+']),
        ("grammar", "json_schema"): st.just(""),
        ("grammar", "json"): st.just(False),
        ("grammar", "regex"): st.just(""),
        ("grammar", "triggers"): st.just(()),
        ("grammar", "trigger_tokens"): st.just(()),
        ("cfg", "negative_prompt"): st.just(""),
        ("watermark", "context_width"): st.integers(1, 3),
        ("watermark", "hashing_key"): st.integers(0, 2**31),
        ("mirostat", "m"): st.integers(1, 120),
        ("top_h", "top_n"): st.integers(1, 120),
        ("reasoning_budget", "start"): st.just("<think>"),  # strings need the tokenizer: given as ids instead
        ("reasoning_budget", "end"): st.just("</think>"),
        ("reasoning_budget", "message"): st.just(""),
        ("reasoning_budget", "start_ids"): _ids(vocab, 1, 3),
        ("reasoning_budget", "end_ids"): _ids(vocab, 1, 3),
        ("reasoning_budget", "message_ids"): _ids(vocab, 0, 3),
        ("reasoning_budget", "warn_at"): st.sampled_from([(), (0.5,), (0.25, 0.75)]),
        ("reasoning_budget", "warn_messages"): st.just(()),  # strings need the tokenizer: given as ids instead
        ("reasoning_budget", "warn_message_ids"): _ids(vocab, 1, 3).map(lambda ids: [ids]),  # one text for all
        ("reasoning_budget", "spans"): st.sampled_from([(), (("```", "```"),)]),  # no text without a tokenizer
    }
    if (name, field) in table:
        return table[(name, field)]
    if field in ("ids", "eos_ids", "eog_ids"):
        return ids
    return None


def _fields(cls: type) -> list[attrs.Attribute]:
    attrs.resolve_types(cls.Params)
    return list(attrs.fields(cls.Params))


def field_strategy(cls: type, field: attrs.Attribute, vocab: int) -> st.SearchStrategy[Any]:
    if is_seed_field(field):
        return st.integers(0, 2**32 - 1)
    special = _special(cls.name, field.name, vocab)
    return special if special is not None else _numeric(field)


def per_request(field: attrs.Attribute) -> bool:
    """The store keeps the field per request (numbers and bools)."""
    return field_type(field) in _DTYPES


# ----------------------------------------------------------------- cases
@attrs.frozen
class Case:
    """One drawn case; its repr rebuilds it (the tensors come from `seed`), so a failure printed by hypothesis can
    be replayed with `check(eval(repr))`."""

    entries: tuple[dict[str, Any], ...]  # the chain, the selector last
    per_row: tuple[dict[str, Any], ...]  # per-request parameters, "<entry id>.<field>" -> value
    vocab: int
    kinds: tuple[str, ...]  # each row's kind of logits (KINDS)
    dtype: str  # the logits' dtype as passed: float32, float16 or bfloat16
    seed: int  # of the generator of the logits, history and unconditional logits
    length: int  # of the history
    history_ids: int  # history tokens are drawn from [0, history_ids)

    @functools.cached_property
    def tensors(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(logits (B, V) of `dtype`, history (B, L) int64 left-padded with -1, unconditional logits (B, V))."""
        gen = torch.Generator().manual_seed(self.seed)
        batch = len(self.kinds)
        logits = torch.stack([row_logits(k, self.vocab, gen) for k in self.kinds])
        if self.dtype == "float16":
            logits = logits.clamp(-6e4, 6e4)
        logits = logits.to(getattr(torch, self.dtype))
        history = torch.randint(0, self.history_ids, (batch, self.length), generator=gen)
        for b in range(batch):  # left padding of its own length per row
            history[b, : int(torch.randint(self.length + 1, (), generator=gen))] = -1
        uncond = torch.randn(batch, self.vocab, generator=gen) * 2
        return logits, history, uncond

    @property
    def logits(self) -> torch.Tensor:
        return self.tensors[0]

    @property
    def history(self) -> torch.Tensor:
        return self.tensors[1]

    @property
    def uncond(self) -> torch.Tensor:
        return self.tensors[2]

    @property
    def tokenizer(self) -> Any:
        return tokenizer() if NEEDS_TOKENIZER & {e["use"] for e in self.entries} else None


def row_logits(kind: str, vocab: int, gen: torch.Generator) -> torch.Tensor:
    x = torch.randn(vocab, generator=gen)
    if kind == "normal":
        return x * float(torch.empty(()).uniform_(0.3, 8.0, generator=gen))
    if kind == "flat":
        return torch.full((vocab,), float(x[0]))
    if kind == "peaked":
        x[int(torch.randint(vocab, (), generator=gen))] += 25.0
        return x
    if kind == "bf16":
        return (x * 3).bfloat16().float()
    if kind == "holes":
        x = (x * 2).masked_fill(torch.rand(vocab, generator=gen) < 0.6, NEG_INF)
        x[int(torch.randint(vocab, (), generator=gen))] = 1.0
        return x
    if kind == "single":
        out = torch.full((vocab,), NEG_INF)
        out[int(torch.randint(vocab, (), generator=gen))] = float(x[0]) * 5
        return out
    assert kind == "huge"
    big = torch.rand(vocab, generator=gen)
    x = torch.where(big < 0.05, torch.sign(x) * 3e38, x)
    return torch.where((big >= 0.05) & (big < 0.1), torch.sign(x) * 1e30, x)


def _cross_field_rules(entry: dict[str, Any], per_row: list[dict[str, Any]]) -> None:
    """Rules between fields that a range per field cannot say: temp_ext's webui formula divides by t - delta;
    reasoning_budget's warnings need their texts."""
    if entry["use"] == "reasoning_budget":
        if entry.get("warn_at"):
            entry.setdefault("warn_message_ids", [[0]])
        else:
            entry.pop("warn_message_ids", None)
    if entry["use"] == "temp_ext" and entry.get("formula") == "webui":
        if entry.get("t", 1.0) - entry.get("delta", 0.0) <= 0:
            entry.pop("delta", None)
        for row in per_row:
            t, delta = (row.get(f"{entry['id']}.{f}", entry.get(f, d)) for f, d in (("t", 1.0), ("delta", 0.0)))
            if t - delta <= 0:
                row[f"{entry['id']}.delta"] = 0.0


@st.composite
def cases(draw: st.DrawFn, pool: Sequence[str] | None = None, selectors: Sequence[str] = SELECTORS) -> Case:
    """A case whose chain draws its entries from `pool` (default: every transform and filter) and its selector
    from `selectors`."""
    names = sorted(catalogue()) if pool is None else list(pool)
    chosen = draw(st.lists(st.sampled_from(names), min_size=1, max_size=6))
    tok = tokenizer() if NEEDS_TOKENIZER & set(chosen) else None
    if tok is not None:
        vocab = len(tok)
    else:
        vocab = draw(st.one_of(st.integers(2, 80), st.integers(81, 3000), st.integers(sc_filters.WIDE, 50_000)))
        if vocab >= sc_filters.WIDE and draw(st.integers(0, 4)):  # keep wide rows to a fifth of the cases
            vocab = draw(st.integers(2, 400))
    batch = draw(st.one_of(st.integers(1, 4), st.integers(5, 16)))
    if vocab >= sc_filters.WIDE:
        batch = min(batch, 6)
    entries: list[dict[str, Any]] = []
    strategies: list[tuple[str, dict[str, st.SearchStrategy[Any]]]] = []
    for i, name in enumerate(chosen + [draw(st.sampled_from(selectors))]):
        cls = catalogue()[name] if i < len(chosen) else get_host().registered("sampler")[name][1]
        entry: dict[str, Any] = {"use": name, "id": f"{name}{i}"}
        per: dict[str, st.SearchStrategy[Any]] = {}
        for field in _fields(cls):
            strategy = field_strategy(cls, field, vocab)
            if field.default is attrs.NOTHING or (name, field.name) in ALWAYS or draw(st.booleans()):
                entry[field.name] = draw(strategy)
            if per_request(field) and (name, field.name) not in CHAIN_LEVEL:
                per[field.name] = strategy
        entries.append(entry)
        strategies.append((entry["id"], per))
    per_row = []
    for _ in range(batch):
        params = {}
        for eid, per in strategies:
            for fname, strategy in per.items():
                seeded = fname == "seed"
                if seeded or draw(st.integers(0, 2)) == 0:  # every random sampler gets a seed per request
                    params[f"{eid}.{fname}"] = draw(strategy)
        per_row.append(params)
    for entry in entries:
        _cross_field_rules(entry, per_row)
    kinds = tuple(draw(st.sampled_from(KINDS)) for _ in range(batch))
    dtype = draw(st.sampled_from(["float32", "float32", "float16", "bfloat16"]))
    history_ids = min(vocab, draw(st.sampled_from([3, 10, vocab])))
    return Case(
        tuple(entries),
        tuple(per_row),
        vocab,
        kinds,
        dtype,
        draw(st.integers(0, 2**31)),
        draw(st.integers(0, 12)),
        history_ids,
    )


# ----------------------------------------------------------------- running a case
def _chain(entries: Sequence[Mapping[str, Any]], tok: Any, vocab: int) -> Chain:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # order pitfalls (a penalty after a truncation) are warned, not refused
        chain = Chain.load({"samplers": [dict(e) for e in entries]})
    chain.prepare(tokenizer=tok, vocab_size=vocab, eos_token_ids=[0] if tok is None else None)
    return chain


def _store(chain: Chain, per_row: Sequence[Mapping[str, Any]], rows: Sequence[int]):
    store = chain.new_store()
    ids = [f"req{b}" for b in rows]
    entries = {spec.id for spec in chain.config.samplers}
    for rid, b in zip(ids, rows):
        store.add(rid, {k: v for k, v in per_row[b].items() if k.split(".")[0] in entries})
    return store, ids


def _pad(i: int) -> list[dict[str, Any]]:
    """i disabled entries, so the next one runs at stream i, as in the full chain (noise is drawn per stream)."""
    return [{"use": "top_k", "k": 0, "id": f"pad{j}"} for j in range(i)]


def _run(chain: Chain, case: Case, rows: Sequence[int], logits: torch.Tensor, *, process: bool):
    store, ids = _store(chain, case.per_row, rows)
    kwargs = dict(history=case.history[list(rows)], unconditional_logits=case.uncond[list(rows)])
    if process:
        return chain.process(logits, store, ids, **kwargs)
    return chain.sample(logits, store, ids, return_scores=True, accept=False, **kwargs)


EMPTIED = re.compile(
    r"every token is masked \(-inf\) for request\(s\) \[(.*?)\] (in the logits as given|after "
    r"sampler .*? at samplers\[(\d+)\])"
)


def _named(exc: SamplechainError, case: Case, rows: Sequence[int]) -> None:
    """An error of a step names the sampler that raised it; one about a row left with nothing names the request
    and the sampler after which it had nothing, which must be one allowed to empty a row."""
    text = str(exc)
    assert isinstance(exc, SamplingError), f"{type(exc).__name__} from a valid chain and valid requests: {text}"
    assert any(f"at samplers[{i}]" in text for i in range(len(case.entries))), f"names no sampler: {text}"
    for requests, _where, index in EMPTIED.findall(text):
        assert any(f"'req{b}'" in requests for b in rows), f"the error names no request: {text}"
        assert index, f"a row given with a finite logit was taken for an empty one: {text}"
        role = catalogue()[case.entries[int(index)]["use"]].effective_role()
        assert role in MAY_EMPTY, f"a {role} sampler left a row with nothing: {text}"


def check(case: Case) -> None:
    batch, vocab = case.logits.shape
    rows = list(range(batch))
    chain = _chain(case.entries, case.tokenizer, vocab)
    try:
        out = _run(chain, case, rows, case.logits, process=False)
    except SamplechainError as exc:
        _named(exc, case, rows)
        return  # the rest (process, stages) may legitimately hold an empty row: nothing more to compare
    scores = _run(chain, case, rows, case.logits, process=True)
    assert torch.equal(scores, out.scores), "process() and sample(return_scores=True).scores differ"
    picked = scores.gather(1, out.token_ids[:, None])[:, 0]
    assert bool(torch.isfinite(picked).all()), f"sampled tokens {out.token_ids.tolist()} were removed by process()"
    assert bool(torch.isfinite(out.logprobs).all()), "non-finite logprob of a sampled token"
    if case.entries[-1]["use"] == "greedy":
        top = scores.amax(dim=1, keepdim=True)
        lowest = torch.where(scores == top, torch.arange(vocab), vocab).amin(dim=1)
        assert torch.equal(out.token_ids, lowest), "greedy did not take the processed row's (lowest-id) maximum"

    # stage by stage on the full vocabulary
    staged = case.logits.float()
    for i, entry in enumerate(case.entries[:-1]):
        stage = _chain(_pad(i) + [entry, {"use": "greedy", "id": "sel"}], case.tokenizer, vocab)
        staged = _run(stage, case, rows, staged, process=True)
    kept, kept_staged = torch.isfinite(scores), torch.isfinite(staged)
    diff = (kept != kept_staged).any(dim=1).nonzero().flatten().tolist()
    assert not diff, f"rows {diff} keep other candidates than the chain run stage by stage"
    assert torch.allclose(scores[kept], staged[kept], rtol=1e-5, atol=1e-6), "processed values differ from stages"
    n = len(case.entries) - 1
    selector = _chain(_pad(n) + [case.entries[-1]], case.tokenizer, vocab)
    alone_sel = _run(selector, case, rows, scores, process=False)
    assert torch.equal(alone_sel.token_ids, out.token_ids), "the selector alone on process() draws other tokens"

    # batch invariance
    for b in rows if vocab < sc_filters.WIDE else rows[:2]:
        one = _run(chain, case, [b], case.logits[b : b + 1], process=False)
        assert torch.equal(one.scores[0], scores[b]), f"row {b} alone keeps other candidates or values"
        assert int(one.token_ids[0]) == int(out.token_ids[b]), f"row {b} alone draws another token"


def test_every_transform_and_filter_is_drawn():
    """The generator covers the catalogue: every registered transform and filter, and none is left out."""
    names = set(catalogue())
    assert {"top_k", "top_p", "typical", "top_n_sigma", "penalties", "grammar", "logit_bias"} <= names
    for _name, cls in catalogue().items():
        for field in _fields(cls):
            field_strategy(cls, field, 100).validate()  # every field has a valid strategy


def truncations() -> list[str]:
    """The filters that cut by probability (llama.cpp's samplers), and temperature."""
    return sorted(n for n, c in catalogue().items() if c.effective_role() == "truncation") + ["temperature"]


@pytest.mark.slow
@FUZZ
@given(cases())
def test_random_compositions(case: Case) -> None:
    """Chains of the whole catalogue."""
    check(case)


@pytest.mark.slow
@FUZZ
@given(cases(pool=truncations(), selectors=("greedy", "dist")))
def test_random_truncation_chains(case: Case) -> None:
    """Chains of the truncating filters alone, where the compaction and sortedness shortcuts interact most."""
    check(case)


def sync_free_samplers() -> list[str]:
    """The transforms and filters that declare a sync-free step (`Sampler.sync_free`)."""
    return sorted(n for n, c in catalogue().items() if c.sync_free)


def check_sync_free(case: Case) -> None:
    """The cuda backend's sync-free step (on CPU tensors) against the cpu backend: two accepted steps, the second
    under `no_host_sync`; the same tokens, or the same error (the deferred one from `SampleOutput.check`)."""
    from samplechain.tools.testing import no_host_sync
    from samplechain_cuda import CudaBackend

    batch, vocab = case.logits.shape
    rows = list(range(batch))
    kwargs = dict(history=case.history, unconditional_logits=case.uncond)
    runs = []
    for sync_free in (False, True):
        chain = _chain(case.entries, case.tokenizer, vocab)
        if sync_free:
            chain._backends["cpu"] = CudaBackend(device="cpu")
        store, ids = _store(chain, case.per_row, rows)
        got: list[Any] = []
        try:
            for step in range(2):
                if sync_free and step:
                    with no_host_sync():
                        out = chain.sample(case.logits, store, ids, **kwargs)
                else:
                    out = chain.sample(case.logits, store, ids, **kwargs)
                got.append(out.check().token_ids.tolist())
        except SamplechainError as exc:
            assert "HostSyncError" not in str(exc), f"the sync-free step read the host: {exc}"
            got.append(f"{type(exc).__name__}: {exc}")
        runs.append(got)
    assert runs[0] == runs[1], f"the sync-free step differs from the cpu backend's: {runs[1]} != {runs[0]}"


@pytest.mark.slow
@settings(FUZZ, max_examples=max(EXAMPLES // 5, 20))
@given(cases(pool=sync_free_samplers(), selectors=("greedy", "dist")))
def test_random_sync_free_chains(case: Case) -> None:
    """Chains of the samplers that declare a sync-free step: no host read, the cpu backend's tokens."""
    check_sync_free(case)


if _SEED is not None:
    test_random_compositions = seed(int(_SEED))(test_random_compositions)
    test_random_truncation_chains = seed(int(_SEED))(test_random_truncation_chains)
    test_random_sync_free_chains = seed(int(_SEED))(test_random_sync_free_chains)
