"""Test doubles and helpers for plugin authors: a recording backend, a scripted-logits source, a one-call runner,
and the checks every sampler's tests repeat (per-request parameters, rows alone, bitwise no-ops, kept logits).

    from samplechain.tools.testing import run_chain
    out = run_chain([MySampler], {"samplers": [{"use": "mine", "x": 0.5}, {"use": "greedy"}]}, logits)

    from samplechain.tools.testing import assert_rows_equal_alone, processed_scores, sampler_chain
    c = sampler_chain({"use": "top_p", "p": 0.9})
    scores = processed_scores(c, logits, [{"top_p": 0.5}, {"top_p": 1.0}])  # one request per row
    assert_rows_equal_alone(c, logits, [{"top_p": 0.5}, {"top_p": 1.0}])
"""

from __future__ import annotations

import contextlib
import math
import traceback
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, ClassVar

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from .. import rng
from ..contracts import Backend, Candidates, Sampler, Stage, StepContext
from ..engine.chain import Chain, SampleOutput
from ..engine.discovery import PluginHost
from ..engine.store import RequestStore
from ..hookspecs import hookimpl
from .tiny_models import (
    TOKENIZER_TEXT,
    ScriptedLM,
    byte_bpe_tokenizer,
    byte_fallback_tokenizer,
    check_eos_ids_from_setup,
    metaspace_tokenizer,
    piece_ids,
    pieces_tokenizer,
    tiny_gpt2,
    wordpiece_tokenizer,
)

__all__ = [
    "RecordingBackend",
    "ScriptedLogits",
    "ArgmaxSelector",
    "host_with",
    "run_chain",
    "byte_bpe_tokenizer",
    "tiny_gpt2",
    "check_eos_ids_from_setup",
    "random_logits",
    "hard_logits",
    "cut_logits",
    "top_k_only",
    "sampler_chain",
    "request_store",
    "sample_steps",
    "processed_scores",
    "assert_rows_equal_alone",
    "assert_bitwise_no_op",
    "assert_kept_logits_bitwise",
    "assert_probs_close",
    "assert_wide_path_keeps",
    "pieces_tokenizer",
    "piece_ids",
    "ScriptedLM",
    "CutoffWarperTests",
    "HostSyncError",
    "no_host_sync",
    "HOST_READS",
    "ReplayGraph",
    "TOKENIZER_TEXT",
    "metaspace_tokenizer",
    "byte_fallback_tokenizer",
    "wordpiece_tokenizer",
]


class RecordingBackend(Backend):
    """The reference primitives in plain torch, recording every call as (primitive, input shape)."""

    name = "recording"
    device_type = "cpu"
    equivalence = "bitwise"

    def __init__(self) -> None:
        self.calls: list[tuple[str, tuple[int, ...]]] = []

    def topk(self, logits: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        self.calls.append(("topk", tuple(logits.shape)))
        return torch.topk(logits, k, dim=-1)

    def ranked_topk(
        self, logits: torch.Tensor, k: int, ids: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        self.calls.append(("ranked_topk", tuple(logits.shape)))
        return super().ranked_topk(logits, k, ids)

    def sort_desc(self, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        self.calls.append(("sort_desc", tuple(logits.shape)))
        return torch.sort(logits, dim=-1, descending=True, stable=True)

    def gumbel(self, seed: torch.Tensor, position: torch.Tensor, ids: torch.Tensor, stream: int) -> torch.Tensor:
        self.calls.append(("gumbel", tuple(ids.shape)))
        return rng.gumbel(seed, position, ids, stream)

    def uniform(self, seed: torch.Tensor, position: torch.Tensor, ids: torch.Tensor, stream: int) -> torch.Tensor:
        self.calls.append(("uniform", tuple(ids.shape)))
        return rng.uniform(seed, position, ids, stream)


class ArgmaxSelector(Sampler):
    """A selector for tests that must not depend on the greedy plugin being installed."""

    name = "test_argmax"
    stage = Stage.SELECT

    def select(self, cand: Candidates, ctx: StepContext) -> torch.Tensor:
        return cand.logits.argmax(dim=-1)


class ScriptedLogits:
    """Logits from a script instead of a model: step t of request r returns script[r][t] (a 1-D tensor)."""

    def __init__(self, script: Mapping[str, Sequence[torch.Tensor]]) -> None:
        self.script = {rid: list(rows) for rid, rows in script.items()}
        self.steps = {rid: 0 for rid in self.script}

    def __call__(self, request_ids: Sequence[str]) -> torch.Tensor:
        rows = []
        for rid in request_ids:
            rows.append(self.script[rid][self.steps[rid]])
            self.steps[rid] += 1
        return torch.stack(rows)


def host_with(*classes: type, backend: type[Backend] = RecordingBackend) -> PluginHost:
    """A plugin host with the installed plugins plus `classes` (samplers, criteria, backends) registered
    in-process, and the test backend and ArgmaxSelector."""
    host = PluginHost(use_env=False)

    class _Plugin:
        @hookimpl
        def register_samplers(self, register: Any) -> None:
            register(ArgmaxSelector)
            for cls in classes:
                if issubclass(cls, Sampler):
                    register(cls)

        @hookimpl
        def register_backends(self, register: Any) -> None:
            register(backend)

    host.register_plugin(_Plugin(), name="samplechain-testing")
    return host


def run_chain(
    classes: Sequence[type],
    config: Mapping[str, Any],
    logits: torch.Tensor,
    params: Sequence[Mapping[str, Any]] | None = None,
) -> SampleOutput:
    """One step of `config` over `logits` with `classes` registered; params: one dict per row (optional)."""
    host = host_with(*classes)
    chain = Chain.load({"backend": "recording", **config}, host=host)
    store = chain.new_store()
    ids = [f"row{i}" for i in range(logits.shape[0])]
    for rid, row in zip(ids, params or [{}] * len(ids)):
        store.add(rid, row)
    return chain.sample(logits, store, ids, return_scores=True)


# ----------------------------------------------------------------- helpers for sampler tests
def random_logits(seed: int, batch: int, vocab: int, scale: float = 1.0) -> torch.Tensor:
    """(batch, vocab) float32 standard normal logits times scale, from a generator seeded with seed (the same
    tensor on every machine and run)."""
    g = torch.Generator().manual_seed(seed)
    return torch.randn(batch, vocab, generator=g) * scale


def hard_logits(batch: int = 6, vocab: int = 50257, seed: int = 0) -> torch.Tensor:
    """Rounded randn x 3 (ties everywhere, the k-th place included) with 30% -inf, huge values every 997th column
    and a last row with only 5 finite entries (fewer than most k): inputs where backends' fast paths can slip."""
    g = torch.Generator().manual_seed(seed)
    x = torch.round(torch.randn(batch, vocab, generator=g) * 3)
    x[torch.rand(batch, vocab, generator=g) < 0.3] = float("-inf")
    x[:, ::997] = 3e38
    x[-1] = float("-inf")
    x[-1, :5] = 1.0
    return x


def cut_logits(vocab: int, seed: int = 0) -> torch.Tensor:
    """8 rows (8, vocab) that stress the cuts of truncating filters: plain float32, bfloat16-rounded (ties),
    integers (long runs of ties), 40% -inf, one dominant token, only 7 finite tokens (fewer than most k), bf16 ties
    under 30% -inf, and logits ~5e7 (noise shifted by the row's maximum)."""
    g = torch.Generator().manual_seed(seed)
    n = lambda scale: torch.randn(vocab, generator=g) * scale  # noqa: E731
    rows = [
        n(3.0),
        n(2.0).bfloat16().float(),
        torch.round(n(2.0)),
        n(3.0),
        n(1.0),
        n(3.0),
        n(4.0).bfloat16().float(),
        n(2.0) + 5e7,
    ]
    rows[3][torch.rand(vocab, generator=g) < 0.4] = float("-inf")
    rows[4][vocab // 3] += 15.0
    rows[5][7:] = float("-inf")
    rows[6][torch.rand(vocab, generator=g) < 0.3] = float("-inf")
    return torch.stack(rows)


def top_k_only(values: torch.Tensor, k: int, *, by: torch.Tensor | None = None) -> torch.Tensor:
    """values (B, V) with every entry outside each row's k largest of `by` (default: values itself) set to -inf:
    what a `top_k` sampler in front of another leaves (of tied entries at the k-th place, the lowest ids stay, as
    in the sampler: a stable descending sort keeps equal entries in id order)."""
    index = torch.sort(values if by is None else by, dim=-1, descending=True, stable=True).indices[:, :k]
    return torch.full_like(values, float("-inf")).scatter_(1, index, values.gather(1, index))


def sampler_chain(
    entry: Mapping[str, Any], *, before: Sequence[Mapping[str, Any]] | None = None, selector: str = "greedy"
) -> Chain:
    """A chain of the samplers in `before`, then `entry` (one sampler's chain entry: {"use": name, ...}), then the
    selector `selector` (a FILTER or TRANSFORM needs one after it)."""
    return Chain.load({"samplers": [*(before or []), dict(entry), {"use": selector}]})


def request_store(chain: Chain, per_row: Sequence[Mapping[str, Any]]) -> tuple[RequestStore, list[str]]:
    """A new store of `chain` with one request per row ("r0", "r1", ...), each with its per-request parameters
    (request aliases or field names), and the request ids in row order."""
    store = chain.new_store()
    ids = [f"r{i}" for i in range(len(per_row))]
    for rid, params in zip(ids, per_row):
        store.add(rid, params)
    return store, ids


def sample_steps(
    chain: Chain, logits: torch.Tensor, per_row: Sequence[Mapping[str, Any]], steps: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Tokens and logprobs (steps, B) of `steps` accepted steps on the same logits, one request per row
    (`request_store`): what seeded draws are compared by across paths and batches."""
    store, ids = request_store(chain, per_row)
    outs = [chain.sample(logits, store, ids) for _ in range(steps)]
    return torch.stack([o.token_ids for o in outs]), torch.stack([o.logprobs for o in outs])


def processed_scores(
    chain: Chain,
    logits: torch.Tensor,
    per_row: Sequence[Mapping[str, Any]] | None = None,
    *,
    process: bool = False,
    **sample_kwargs: Any,
) -> torch.Tensor:
    """(B, V) processed scores of one step: -inf for removed tokens, as transformers reports them.

    per_row: one dict of per-request parameters per row (a store with one request per row, `request_store`); None:
    every row is a fresh request with the chain's parameters. By default the step is `chain.sample(...,
    return_scores=True)` (the selector runs and the tokens are accepted); process=True runs `chain.process` instead
    (transforms and filters only, nothing accepted). sample_kwargs (history=, prompt_lengths=,
    unconditional_logits=) go to that call."""
    args = () if per_row is None else request_store(chain, per_row)
    if process:
        return chain.process(logits, *args, **sample_kwargs)
    scores = chain.sample(logits, *args, return_scores=True, **sample_kwargs).scores
    assert scores is not None  # asked for with return_scores=True
    return scores


def assert_rows_equal_alone(
    chain: Chain,
    logits: torch.Tensor,
    per_row: Sequence[Mapping[str, Any]],
    *,
    process: bool = False,
    **sample_kwargs: Any,
) -> torch.Tensor:
    """Batch invariance with per-request parameters: the processed scores of the batch (one request per row with
    per_row[i]) equal, bitwise and row by row, those of each row run alone as a batch of one. Tensor sample_kwargs
    with one entry per row (history, prompt_lengths, unconditional_logits) are sliced to the row. Returns the
    batch's scores for further checks."""
    rows = len(per_row)
    batch = processed_scores(chain, logits, per_row, process=process, **sample_kwargs)
    for i, params in enumerate(per_row):
        row_kwargs = {
            key: value[i : i + 1]
            if isinstance(value, torch.Tensor) and value.dim() and value.shape[0] == rows
            else value
            for key, value in sample_kwargs.items()
        }
        alone = processed_scores(chain, logits[i : i + 1], [params], process=process, **row_kwargs)[0]
        assert torch.equal(batch[i], alone), f"row {i} {dict(params)}: batch != alone"
    return batch


def assert_bitwise_no_op(
    chain: Chain,
    logits: torch.Tensor,
    per_row: Sequence[Mapping[str, Any]] | None = None,
    *,
    process: bool = False,
    **sample_kwargs: Any,
) -> None:
    """The processed scores are the input logits, bitwise (a disabled value must pass rows through unchanged)."""
    out = processed_scores(chain, logits, per_row, process=process, **sample_kwargs)
    assert torch.equal(out, logits), "a disabled sampler must leave the logits bitwise unchanged"


def assert_kept_logits_bitwise(ours: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
    """A filter's output: every kept (finite) entry of ours is the input logit bitwise (compared as float32),
    every removed one -inf. Returns the kept mask."""
    kept = torch.isfinite(ours)
    assert torch.equal(ours[kept], logits.float()[kept]), "kept logits must be the input logits, bitwise"
    assert bool((ours[~kept] == float("-inf")).all()), "removed logits must be -inf"
    return kept


def assert_probs_close(ours: torch.Tensor, ref: torch.Tensor, atol: float = 1e-5, *, sort_rows: bool = False) -> None:
    """softmax(ours) and softmax(ref) in float64 agree within atol (rtol 0). sort_rows: compare each row's values
    sorted in descending order (the kept multiset, independent of which of tied tokens survives)."""
    if sort_rows:
        ours = ours.double().sort(dim=-1, descending=True).values
        ref = ref.double().sort(dim=-1, descending=True).values
    got = torch.softmax(ours.double(), dim=-1)
    want = torch.softmax(ref.double(), dim=-1)
    assert torch.allclose(got, want, atol=atol, rtol=0), f"max diff {(got - want).abs().max().item():.3g}"


class CutoffWarperTests:
    """Shared tests of a filter that ports a transformers probability-cutoff warper called as
    `warper(cutoff, min_tokens_to_keep=...)` (EpsilonLogitsWarper, EtaLogitsWarper). Subclass it in the plugin's
    test module under a name pytest collects, and set the class attributes:

        class TestEpsilon(CutoffWarperTests):
            sampler, field, alias, warper = "epsilon", "epsilon", "epsilon_cutoff", EpsilonLogitsWarper

    Equivalence: probabilities within `atol` of the warper run on float64 logits; kept sets equal but for at most
    `max_set_diff` tokens whose probability is within float rounding of the cutoff; kept logits bitwise the input,
    removed ones -inf. Covered: random logits, float16 / bfloat16 input with ties, -inf entries, min_keep (ties at
    its boundary all kept, 0 keeps the top token), after top_k, per-row parameters equal rows alone, 0 is a
    bitwise no-op, bad chain and request values refused naming the key, a chain with dist draws a kept token.
    Parameters are given by `pytest_generate_tests` (so that this module does not import pytest).
    """

    sampler: ClassVar[str]  # the chain name
    field: ClassVar[str]  # the cutoff's Params field
    alias: ClassVar[str]  # its per-request name
    warper: ClassVar[Callable[..., Any]]
    values: ClassVar[tuple[float, ...]] = (1e-5, 3e-4, 1e-3, 0.01, 0.1)
    flat_rows_keep_only_the_top: ClassVar[bool] = False  # with min_keep 0, a flat row keeps exactly its top token
    batch: ClassVar[int] = 6
    atol: ClassVar[float] = 1e-5
    max_set_diff: ClassVar[int] = 2

    def pytest_generate_tests(self, metafunc: Any) -> None:
        axes: dict[str, list[tuple[str, Any]]] = {
            "test_matches_transformers_on_random_logits": [
                ("vocab", (50, 1000, 32000)),
                ("seed", (0, 1)),
                ("value", self.values),
            ],
            "test_half_precision_input_with_ties_matches_transformers": [
                ("dtype", (torch.float16, torch.bfloat16)),
                ("value", (3e-4, 0.01)),
            ],
            "test_min_keep_matches_transformers": [("value,min_keep", [(0.5, 5), (0.9, 20), (0.01, 3)])],
            "test_zero_is_a_bitwise_no_op": [("vocab", (50, 32000))],
            "test_bad_values_are_refused": [
                (
                    "key,value",
                    [
                        (self.field, 1.0),
                        (self.field, -0.1),
                        (self.field, math.nan),
                        (self.field, math.inf),
                        ("min_keep", -1),
                    ],
                )
            ],
        }
        for names, values in axes.get(metafunc.function.__name__, ()):
            metafunc.parametrize(names, values)

    # ------------------------------------------------------------- helpers
    def logits(self, seed: int, vocab: int, scale: float = 2.0) -> torch.Tensor:
        return random_logits(seed, self.batch, vocab, scale)

    def chain(self, value: float = 0.0, min_keep: int = 1, before: list | None = None) -> Chain:
        return sampler_chain({"use": self.sampler, self.field: value, "min_keep": min_keep}, before=before)

    def reference(self, logits: torch.Tensor, value: float, min_keep: int = 1) -> torch.Tensor:
        return self.warper(value, min_tokens_to_keep=max(min_keep, 1))(None, logits.double())

    def assert_close_to(self, ours: torch.Tensor, logits: torch.Tensor, ref: torch.Tensor) -> None:
        kept = assert_kept_logits_bitwise(ours, logits)
        assert_probs_close(ours, ref, self.atol)
        differ = kept != torch.isfinite(ref)
        assert int(differ.sum()) <= self.max_set_diff, f"kept sets differ at {differ.nonzero()[:8].tolist()}"

    # ------------------------------------------------------------- tests
    def test_matches_transformers_on_random_logits(self, vocab: int, seed: int, value: float) -> None:
        logits = self.logits(seed, vocab)
        ours = processed_scores(self.chain(value), logits, process=True)
        self.assert_close_to(ours, logits, self.reference(logits, value))

    def test_half_precision_input_with_ties_matches_transformers(self, dtype: torch.dtype, value: float) -> None:
        logits = self.logits(5, 4000, 3.0).to(dtype)
        up = logits.double()
        assert int((up[0][:, None] == up[0][None, :]).sum()) > 4000 + 100, "the test needs ties"
        ours = processed_scores(self.chain(value), logits, process=True)
        self.assert_close_to(ours, up, self.reference(up, value))

    def test_ties_at_the_min_keep_boundary_are_all_kept(self) -> None:
        """transformers keeps every token whose logit is >= the min_keep-th largest: ties there all survive."""
        logits = torch.full((1, 20), -5.0)
        logits[0, :6] = torch.tensor([3.0, 2.0, 1.0, 1.0, 1.0, 0.5])
        ours = processed_scores(self.chain(0.9, 3), logits, process=True)
        ref = self.reference(logits, 0.9, 3)
        assert torch.equal(torch.isfinite(ours), torch.isfinite(ref))
        assert int(torch.isfinite(ours).sum()) == 5

    def test_minus_inf_entries_are_never_kept(self) -> None:
        logits = self.logits(6, 1000)
        logits[:, 1::3] = float("-inf")
        ours = processed_scores(self.chain(1e-3), logits, process=True)
        assert not bool(torch.isfinite(ours[:, 1::3]).any())
        self.assert_close_to(ours, logits, self.reference(logits, 1e-3))

    def test_min_keep_matches_transformers(self, value: float, min_keep: int) -> None:
        logits = self.logits(3, 1000)
        ours = processed_scores(self.chain(value, min_keep), logits, process=True)
        self.assert_close_to(ours, logits, self.reference(logits, value, min_keep))
        assert bool((torch.isfinite(ours).sum(dim=-1) >= min_keep).all())

    def test_min_keep_zero_still_keeps_the_top_token(self) -> None:
        logits = self.logits(3, 1000, 0.1)  # flat: no probability reaches 0.5
        ours = processed_scores(self.chain(0.5, 0), logits, process=True)
        counts = torch.isfinite(ours).sum(dim=-1)
        assert bool((counts >= 1).all())
        assert torch.equal(ours.argmax(dim=-1), logits.argmax(dim=-1))
        if self.flat_rows_keep_only_the_top:
            assert torch.equal(counts, torch.ones(self.batch, dtype=torch.int64))

    def test_after_top_k_matches_transformers_pipeline(self) -> None:
        from transformers.generation.logits_process import TopKLogitsWarper

        logits = self.logits(12, 5000)
        ours = processed_scores(self.chain(0.02, before=[{"use": "top_k", "k": 40}]), logits, process=True)
        after_k = TopKLogitsWarper(40)(None, logits.clone())
        self.assert_close_to(ours, after_k, self.reference(after_k, 0.02))

    def test_per_row_params_equal_rows_alone(self) -> None:
        alias = self.alias
        rows: list[dict[str, Any]] = [
            {alias: 0.0},
            {alias: 1e-4},
            {alias: 0.05, "min_keep": 7},
            {alias: 1e-3},
            {alias: 0.0, "min_keep": 9},
            {alias: 0.2, "min_keep": 2},
        ]
        logits = self.logits(7, 3000)
        batch = assert_rows_equal_alone(self.chain(), logits, rows, process=True)
        for i, params in enumerate(rows):
            if params[alias] <= 0.0:
                assert torch.equal(batch[i], logits[i])
            else:
                ref = self.reference(logits[i : i + 1], params[alias], params.get("min_keep", 1))
                self.assert_close_to(batch[i : i + 1], logits[i : i + 1], ref)

    def test_zero_is_a_bitwise_no_op(self, vocab: int) -> None:
        logits = self.logits(9, vocab)
        assert_bitwise_no_op(self.chain(0.0, 5), logits, process=True)
        assert_bitwise_no_op(self.chain(0.0), logits)

    def test_bad_values_are_refused(self, key: str, value: float) -> None:
        import pytest

        from ..errors import ConfigError

        entry = {"use": self.sampler, self.field: 1e-3, key: value}
        with pytest.raises(ConfigError, match=key):
            Chain.load({"samplers": [entry, {"use": "dist"}]})

    def test_bad_request_value_is_refused(self) -> None:
        import pytest

        from ..errors import RequestError

        store = self.chain(1e-3).new_store()
        with pytest.raises(RequestError, match=self.field):
            store.add("r", {self.alias: 1.5})

    def test_chain_with_dist_samples_a_kept_token(self) -> None:
        c = sampler_chain({"use": self.sampler, self.field: 0.01}, selector="dist")
        out = c.sample(self.logits(0, 100), return_scores=True)
        assert out.scores is not None
        assert bool(torch.isfinite(out.scores.gather(1, out.token_ids[:, None])).all())


def assert_wide_path_keeps(
    entry: Mapping[str, Any],
    monkeypatch: Any,
    per_row: Sequence[Mapping[str, Any]],
    scale: float,
    seed: int = 11,
    vocab: int = 40000,
) -> torch.Tensor:
    """A sampler's wide-row fast path (rows >= filters.WIDE) against its plain path (WIDE raised past the row) on
    random rows of `vocab` (every third entry of row 1 -inf): bitwise the same processed scores, and the sampler
    did remove tokens. Returns the scores. `monkeypatch` is pytest's fixture."""
    logits = random_logits(seed, len(per_row), vocab, scale)
    logits[1, ::3] = float("-inf")
    chain = sampler_chain(entry)
    fast = processed_scores(chain, logits, per_row)
    monkeypatch.setattr("samplechain.filters.WIDE", 10**9)
    assert torch.equal(fast, processed_scores(chain, logits, per_row))
    assert bool(torch.isfinite(fast).sum(dim=-1).lt(vocab).any()), "the sampler removed nothing: a vacuous check"
    return fast


# aten ops that make the host wait for the device: a value read on the host, or an output whose size depends on data
HOST_READS = frozenset(
    {
        "_local_scalar_dense",
        "nonzero",
        "nonzero_static",
        "masked_select",
        "_unique2",
        "unique_dim",
        "unique_consecutive",
        "repeat_interleave",
        "equal",
        "is_nonzero",
        "_assert_async",
    }
)


class HostSyncError(AssertionError):
    """A step read a tensor's value on the host (or made a data-dependent shape) under `no_host_sync`."""


class _NoHostSync(TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        if name in HOST_READS:
            raise HostSyncError(f"aten.{name} waits for the device, at {_caller()}")
        return func(*args, **(kwargs or {}))


def _caller() -> str:
    frames = [
        f
        for f in traceback.extract_stack()[:-2]
        if "/torch/" not in f.filename and not f.filename.endswith(("testing.py", "contextlib.py"))
    ]
    return " <- ".join(f"{f.filename.rsplit('/', 1)[-1]}:{f.lineno} {f.name}" for f in frames[-3:][::-1]) or "?"


@contextlib.contextmanager
def no_host_sync() -> Iterator[None]:
    """Fail (HostSyncError, naming the place) on anything in the block that would make the host wait for the device:
    `.item()`, `bool` / `int` / `float` of a tensor, `nonzero`, `masked_select` and the other ops of data-dependent
    size (at dispatch, so on CPU tensors too), and `.tolist()` / `.numpy()` (which CPU tensors answer without a
    dispatch). Run a sync-free backend's step on CPU tensors under it (`CudaBackend(device="cpu")`): CI has no GPU,
    and torch.cuda.set_sync_debug_mode("error") needs one."""

    def refuse(what: str) -> Callable[..., Any]:
        def read(*args: Any, **kwargs: Any) -> Any:
            raise HostSyncError(f"Tensor.{what}() reads the values on the host, at {_caller()}")

        return read

    saved = {name: getattr(torch.Tensor, name) for name in ("tolist", "numpy")}
    try:
        for name in saved:
            setattr(torch.Tensor, name, refuse(name))
        with _NoHostSync():
            yield
    finally:
        for name, fn in saved.items():
            setattr(torch.Tensor, name, fn)


class _Recorder(TorchDispatchMode):
    def __init__(self, ops: list) -> None:
        super().__init__()
        self.ops = ops

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        self.ops.append((func, args, kwargs, out))
        return out


class ReplayGraph:
    """A CUDA graph's semantics on CPU tensors, for tests (`samplechain.engine.graphs.StepGraphs(make_graph=ReplayGraph)`):
    capture runs the step under `no_host_sync` (a host read cannot be recorded) and records every aten op with its
    arguments and outputs; replay runs the ops again on the same tensors, writing each result into the recorded
    output, so Python decisions taken during capture stay baked in and every tensor keeps its storage, as a CUDA
    graph replays kernels on fixed addresses. Ops outside aten (a Triton kernel) are not recorded: test the torch
    ops path with it."""

    def __init__(self) -> None:
        self.ops: list[tuple[Any, tuple, dict, Any]] = []

    def capture(self, step: Callable[[], Any]) -> Any:
        with no_host_sync(), _Recorder(self.ops):
            return step()

    def replay(self) -> None:
        for func, args, kwargs, recorded in self.ops:
            result = func(*args, **kwargs)
            pairs = zip(recorded, result) if isinstance(recorded, (tuple, list)) else [(recorded, result)]
            for old, new in pairs:
                if isinstance(old, torch.Tensor) and new is not old and not _same_memory(old, new):
                    old.copy_(new)


def _same_memory(a: torch.Tensor, b: torch.Tensor) -> bool:
    """A view op run again on the same base (expand, slicing): nothing to copy (an expanded view cannot take one)."""
    return (
        a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()
        and a.storage_offset() == b.storage_offset()
        and a.stride() == b.stride()
    )
