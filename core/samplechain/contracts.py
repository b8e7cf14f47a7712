"""The contracts plugins implement: Sampler, StoppingCriterion, Backend (the batched candidate set they work on:
`candidates`).

This module (with `params` for validators) is all a plugin needs to import; docs/architecture.md lists the whole
contract.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar, NamedTuple, Protocol

import attrs
import torch

from .candidates import (
    Backend,
    Candidates,
    NoParams,
    PluginClass,
    StepContext,
    compact_kept,
    in_sync_free_step,
    lowest_equal,
    ranked_keys,
    ranked_topk,
    settle_ties,
    sync_free_step,
    tied_rows,
)

__all__ = [
    "Stage",
    "Candidates",
    "StepContext",
    "Sampler",
    "StoppingCriterion",
    "StopSetup",
    "StopContext",
    "StopMatch",
    "SamplerSetup",
    "EosIds",
    "Backend",
    "FusedPart",
    "FUSED_SAMPLE",
    "FUSED_KINDS",
    "BUCKET_MASS",
    "TYPICAL_BAND",
    "TOP_P_CANDIDATES",
    "ROW_LSE",
    "KERNELS",
    "FusedDraw",
    "TopPCandidates",
    "TypicalBand",
    "FusedSampleKernel",
    "BucketMassKernel",
    "TypicalBandKernel",
    "TopPCandidatesKernel",
    "RowLseKernel",
    "LSE64_WIDTH",
    "max_positions",
    "token_id_list",
    "NoParams",
    "PluginClass",
    "ALL_DEVICES",
    # the candidate set and its tie rule, defined in .candidates (these names stay importable from here)
    "compact_kept",
    "in_sync_free_step",
    "lowest_equal",
    "ranked_keys",
    "ranked_topk",
    "settle_ties",
    "sync_free_step",
    "tied_rows",
]

NEG_INF = float("-inf")
ALL_DEVICES = frozenset({"cpu", "cuda", "mps"})


class Stage(str, enum.Enum):
    """Where a sampler sits in a chain. A chain is transforms and filters in any order, then one selector."""

    TRANSFORM = "transform"  # rewrites logits: penalties, bias, temperature, grammar mask
    FILTER = "filter"  # removes candidates: top-k, top-p, min-p, typical, xtc ...
    SELECT = "select"  # picks one token per row: greedy, dist, mirostat ...


FUSED_SAMPLE = "samplechain.fused_sample"  # Backend.kernel name of a fused truncate-and-draw (see FusedPart)
FUSED_KINDS = ("temperature", "top_k", "top_p", "min_p", "dist", "greedy")
BUCKET_MASS = "samplechain.bucket_mass"  # Backend.kernel name of filters.bucket_mass's histogram (None: torch's)
# Backend.kernel name of typical sampling's candidates on a full-vocabulary row: kernel(logits (B, V) float32, p (B,),
# min_keep (B,)) -> None, or a TypicalBand (values (B, W), positions (B, W), counts (B,), c (B,), log Z (B,)): per row the mean
# logit c = sum p_i x_i and log Z in float64, and in values[b, :counts[b]] / positions the tokens with |c - x| <= D
# in position order (-inf and other columns past the count), D such that they surely hold more than p and at least
# min_keep tokens: a prefix of the ranking by |c - x| (count -1: the row is left to the caller)
TYPICAL_BAND = "samplechain.typical_band"
# Backend.kernel name of top_p on unsorted full-vocabulary rows: kernel(logits (B, V) float32, p (B,), min_keep
# (B,)) -> None, or a TopPCandidates (top (B, 1) float64, total (B,) float64, threshold (B,) float32, values, positions, trusted,
# kept): the maximum, the normaliser sum e**(x - top) (to ~1e-15), a logit at or below the last token top-p keeps,
# Backend.at_least(logits, threshold, max(min_keep))'s result and how many of those top-p keeps (the last four None
# where the kernel does not gather: the caller asks at_least and cuts)
TOP_P_CANDIDATES = "samplechain.top_p_candidates"
# Backend.kernel name of the executor's normaliser of rows up to LSE64_WIDTH wide: kernel(x (B, W) float32) -> None,
# or (B,) float32: top + log sum e**(x - top) per row, summed in float64 (top the row's maximum, 0 where it is not
# finite; NaN for a row holding a NaN), each row the same to the bit whatever its width past its last finite entry
ROW_LSE = "samplechain.row_lse"
# Up to this many candidates a row's normaliser (its logprobs' log-sum-exp) is accumulated in float64 (the same to
# the bit whatever the row's width or batch); wider rows (a full vocabulary) take a float32 log-sum-exp, which
# fused kernels may compute their own way (within ~1e-6)
LSE64_WIDTH = 1 << 16


class FusedDraw(NamedTuple):
    """What a FUSED_SAMPLE kernel draws: token ids (B,) int64 and their logprobs (B,) float32 under the kept
    distribution."""

    token_ids: torch.Tensor
    logprobs: torch.Tensor


class TopPCandidates(NamedTuple):
    """What a TOP_P_CANDIDATES kernel finds (see there); the last four None where it does not gather."""

    top: torch.Tensor  # (B, 1) float64 each row's maximum
    total: torch.Tensor  # (B,) float64 the normaliser sum e**(x - top)
    threshold: torch.Tensor  # (B,) float32 a logit at or below the last token top-p keeps
    values: torch.Tensor | None  # (B, W) Backend.at_least(logits, threshold, max(min_keep))'s values
    positions: torch.Tensor | None  # (B, W) their positions
    counts: torch.Tensor | None  # (B,) how many are at or above the threshold
    kept: torch.Tensor | None  # (B,) how many of them top-p keeps


class TypicalBand(NamedTuple):
    """What a TYPICAL_BAND kernel finds (see there)."""

    values: torch.Tensor  # (B, W) float32 the band's logits in position order, -inf past the count
    positions: torch.Tensor  # (B, W) int64 their positions
    counts: torch.Tensor  # (B,) int64 the band's size (-1: the row is left to the caller)
    center: torch.Tensor  # (B,) float64 the mean logit c = sum p_i x_i
    lse: torch.Tensor  # (B,) float64 log Z


class FusedSampleKernel(Protocol):
    """`Backend.kernel(FUSED_SAMPLE)`: None where it cannot run the combination (the samplers run it)."""

    def __call__(
        self, logits: torch.Tensor, parts: Sequence[FusedPart], select: FusedPart, positions: torch.Tensor, stream: int
    ) -> FusedDraw | None: ...


class BucketMassKernel(Protocol):
    """`Backend.kernel(BUCKET_MASS)`: filters.bucket_mass's (B, BUCKETS) float32 sums of values (B, K) >= 0."""

    def __call__(self, values: torch.Tensor) -> torch.Tensor | None: ...


class TypicalBandKernel(Protocol):
    """`Backend.kernel(TYPICAL_BAND)`: logits (B, V) float32, p (B,), min_keep (B,)."""

    def __call__(self, logits: torch.Tensor, p: torch.Tensor, min_keep: torch.Tensor) -> TypicalBand | None: ...


class TopPCandidatesKernel(Protocol):
    """`Backend.kernel(TOP_P_CANDIDATES)`: logits (B, V) float32, p (B,), min_keep (B,)."""

    def __call__(self, logits: torch.Tensor, p: torch.Tensor, min_keep: torch.Tensor) -> TopPCandidates | None: ...


class RowLseKernel(Protocol):
    """`Backend.kernel(ROW_LSE)`: x (B, W) float32 -> (B,) float32."""

    def __call__(self, x: torch.Tensor) -> torch.Tensor | None: ...


# Each backend kernel name and the signature a kernel registered under it has.
KERNELS: Mapping[str, type] = {
    FUSED_SAMPLE: FusedSampleKernel,
    BUCKET_MASS: BucketMassKernel,
    TYPICAL_BAND: TypicalBandKernel,
    TOP_P_CANDIDATES: TopPCandidatesKernel,
    ROW_LSE: RowLseKernel,
}


@attrs.frozen
class FusedPart:
    """What a sampler does on this step's batch, told to a backend's fused truncate-and-draw kernel
    (`Backend.kernel(FUSED_SAMPLE)`) so it can run a chain's tail in one launch instead of sampler by sampler.

    kind: "temperature" (value t: logits / t, t = 0 keeps the first maximum), "top_k" (value k), "top_p" (value p),
    "min_p" (value p), each of the last three with its min_keep, exactly as the plugins of those names define them
    (the kept sets settle equal logits by lowest id), or a selector: "dist" (value: the seeds (B,) int64 of a
    Gumbel-max draw with the counter-based noise) or "greedy" (value None: the largest logit, of equal ones the
    lowest id). value and min_keep: a Python number shared by the batch (the
    sampler's scalar path), or a (B,) tensor of per-request values (its per-row path). A temperature given as a
    Python number ranks the following top_k by the raw logits (the executor runs top_k before an order-preserving
    transform it precedes); the executor hands it as a tensor where the chain would not and a top_k follows.

    The kernel is called as kernel(logits (B, V) float32, parts (in chain order), select (the selector's part),
    positions (B,), stream) and returns a `FusedDraw` (token ids (B,) int64, their logprobs (B,) float32 under the
    kept distribution), or None when it cannot run that combination (the executor then runs the samplers). A kernel
    with a `fused_kinds` attribute (a set of kinds) takes no part of another kind: the executor stops looking at
    the chain's tail there (a cheaper step where the kernel would decline anyway)."""

    kind: str = attrs.field(validator=attrs.validators.in_(FUSED_KINDS))
    value: Any
    min_keep: Any = 1


class Sampler(PluginClass):
    """One step of a chain, applied to a whole batch at once.

    What every sampler implements (a new sampler needs nothing else):
      - class attributes `name`, `stage`, `Params` (an attrs class whose fields are the parameters, with validators
        and defaults), and optionally `version`, `summary`, `request_aliases`, `role`, `sync_free`;
      - `apply` (transform / filter) or `select` (selector). Parameters arrive per row through `ctx.param(field)`;
        a row whose value disables the sampler must pass through unchanged;
      - where it applies: `prepare` (read the tokenizer / model once per generation), `is_stateful` with
        `state_spec` and `accept` (per-request state), `needs_history`, `needs_unconditional_logits`,
        `supported_devices`, `is_argmax_invariant`.

    The optional capabilities below the line let the executor go faster; their defaults are always correct. Each
    is declared (a class attribute, or a method that answers for the step's batch), never found by inspecting
    which methods a subclass overrides.
    """

    # ----------------------------------------------------------------- what every sampler implements
    stage: ClassVar[Stage]
    # Flat per-request parameter names (as vLLM's SamplingParams / MindIE's SamplingParam) -> Params field.
    request_aliases: ClassVar[Mapping[str, str]] = {}
    # What the sampler does, for chain validation: "truncation" (removes tokens by probability: top-k, top-p ...),
    # "penalty" / "bias" (moves particular tokens' logits), "mask" (removes particular tokens: grammar, allowed
    # tokens), "shape" (reshapes the whole distribution: temperature), "guidance". Empty: a FILTER counts as a
    # truncation, a TRANSFORM as a shape.
    role: ClassVar[str] = ""
    # A selector that chooses its own candidate set (mirostat): reference engines drop truncation samplers in
    # front of it, so the chain warns when there are some.
    replaces_truncation: ClassVar[bool] = False
    # True: in a sync-free step (`in_sync_free_step()`, on the cuda backend) apply / select / accept read nothing
    # on the host and size nothing by the data (tested under samplechain.tools.testing.no_host_sync). False: host-bound,
    # the default: a chain with it still runs, waiting for the device where the sampler reads it.
    sync_free: ClassVar[bool] = False
    # The per-request field holding a row's minimum of new tokens (min_new_tokens: vLLM's min_tokens). Before a
    # row has generated that many, the stopping criteria gated by it (`StoppingCriterion.min_new_tokens_gate`:
    # eos, stop strings, stop_regex, repetition) do not stop it either.
    min_new_tokens_field: ClassVar[str | None] = None
    # False: the sampler's state cannot be copied and set back (it lives outside the request store: a service, a
    # clock). Speculative decoding draws position after position on a row's state and a draft model draws on a
    # copy of it, so a generation with a drafter refuses a chain holding such a sampler before it starts.
    forkable: ClassVar[bool] = True

    @classmethod
    def effective_role(cls) -> str:
        if cls.role:
            return cls.role
        return {Stage.FILTER: "truncation", Stage.TRANSFORM: "shape"}.get(cls.stage, "select")

    def apply(self, cand: Candidates, ctx: StepContext) -> Candidates:
        """Transforms and filters: the candidates after this sampler (never `cand.logits` modified in place unless
        `cand.writable`; removed candidates -inf, or compacted away)."""
        raise NotImplementedError(f"{self.qualified_name()} is a {self.stage.value} sampler without apply()")

    def select(self, cand: Candidates, ctx: StepContext) -> torch.Tensor:
        """Return the chosen candidate position (B,) int64 into cand's K axis."""
        raise NotImplementedError(f"{self.qualified_name()} is not a selector")

    def prepare(self, setup: SamplerSetup) -> None:
        """Once per generation (or `chain.prepare(...)`), before the first step: read what the sampler needs from
        the tokenizer and model (DRY resolves its breaker strings, min_new_tokens its eos ids, grammar compiles).
        May raise ConfigError / ValueError naming the missing piece; the chain reports it with the plugin."""

    def is_stateful(self) -> bool:
        """True when the sampler keeps per-request state in the store (see `state_spec`)."""
        return False

    def state_spec(self) -> Mapping[str, tuple[torch.dtype, tuple[int, ...], float | int]]:
        """Per-request state columns: name -> (dtype, per-row shape, initial value)."""
        return {}

    def accept(self, ctx: StepContext, token_ids: torch.Tensor) -> Mapping[str, torch.Tensor]:
        """Given the chosen tokens (B,), return updated state columns (B, ...) for this batch."""
        return {}

    def needs_history(self) -> bool:
        """True when the sampler reads previous tokens (penalties, DRY ...)."""
        return False

    def needs_unconditional_logits(self) -> bool:
        """True when the sampler needs a second forward per step on a negative prompt (classifier-free guidance):
        `generate()` runs it and passes the logits as `ctx.unconditional_logits`."""
        return False

    def supported_devices(self) -> frozenset[str]:
        """The device types (backends' `device_type`) the sampler runs on."""
        return ALL_DEVICES

    def is_argmax_invariant(self) -> bool:
        """True when the sampler never changes which token greedy decoding would pick."""
        return False

    # ----------------------------------------------------------------- optional: the executor's fast paths
    # Declared flags: True where the class implements the method of that name (tests/test_sampler_contract.py
    # checks every registered sampler); the executor calls it only then.
    has_sparse_changes: ClassVar[bool] = False  # `sparse_changes` (penalties)
    has_fused_part: ClassVar[bool] = False  # `fused` (temperature, top_k, top_p, min_p, dist)

    def is_noop(self, ctx: StepContext) -> bool:
        """True when apply() returns its input unchanged on this step's batch (a disabled sampler): the executor may
        look past it when it fuses its neighbours. Read from the batch's parameters only (ctx.scalar, param,
        bound), never its state, history or positions: the executor keeps the answer, with `fused`'s, while the
        batch and its parameters stay the same."""
        return False

    def syncs_on(self, ctx: StepContext) -> bool:
        """True when apply / select / accept may read the device on the host for this step's batch: not for a
        `sync_free` sampler, nor for a no-op (`is_noop`); a host-bound sampler may say so for some parameters
        (temp_ext with delta 0 is a plain temperature). What decides whether a step can be captured in a CUDA graph
        (samplechain.engine.graphs)."""
        return not type(self).sync_free and not self.is_noop(ctx)

    def fused(self, ctx: StepContext) -> FusedPart | None:
        """With `has_fused_part`: what apply() (a selector: select()) does on this step's batch as a part of a
        backend's fused truncate-and-draw kernel (`FusedPart`), or None when it is none of the kinds the kernel
        knows. Called only when the sampler is not a no-op on the batch (`is_noop`); must read nothing on the
        device, and, as is_noop, only the batch's parameters."""
        return None

    def sparse_changes(
        self, cand: Candidates, ctx: StepContext
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
        """With `has_sparse_changes`: on the full untouched vocabulary (cand.ids is None) what apply() would change,
        as token ids (B, L), their new logits (B, L) and a mask (B, L) of the changes, each id at most once per row;
        None when the sampler cannot say (the executor then calls apply). Lets a following rank-only filter run on
        the changed row without the (B, V) copy apply() must write into."""
        return None

    def is_rank_only(self) -> bool:
        """True when apply() depends only on the order of each row's logits and keeps their values (top_k): an
        order-preserving transform right before it may then run after it, on the survivors only."""
        return False

    def rank_counts(self, cand: Candidates, ctx: StepContext) -> torch.Tensor | None:
        """For rank-only filters (`is_rank_only`): how many of the best candidates each row keeps (B,), or None when
        a row keeps every candidate."""
        return None

    def preserves_order(self, ctx: StepContext) -> bool:
        """True when apply() on this step's batch maps every row's logits through a non-decreasing function and
        nothing else (temperature with t > 0): the executor may run a following rank-only filter first."""
        return False


@attrs.define(slots=True)
class SamplerSetup:
    """What samplers may read once per generation in `Sampler.prepare` (every field may be None / empty when the
    chain runs on bare logits without a model).

    vocab_size: the logits' width, when known. tokenizer: a Hugging Face tokenizer (or None).
    eos_token_ids: the ids that end a row (generation config, model config or tokenizer, as transformers).
    """

    vocab_size: int | None = None
    tokenizer: Any = None
    model_config: Any = None
    generation_config: Any = None
    eos_token_ids: tuple[int, ...] = ()
    extra: Mapping[str, Any] = attrs.field(factory=dict)


class EosIds:
    """Mixin for samplers with an `eos_ids` parameter: when it is empty, the generation's eos ids are used
    (`SamplerSetup.eos_token_ids`, from the tokenizer / generation config / model config as transformers reads
    them). `self.eos_tensor()` is the ids as an int64 tensor; with neither it raises an error saying what to do."""

    _setup_eos: tuple[int, ...] = ()

    def prepare(self, setup: SamplerSetup) -> None:
        self._setup_eos = tuple(setup.eos_token_ids)

    def eos_tensor(self, device: Any = None) -> torch.Tensor:
        ids = tuple(self.params.eos_ids) or self._setup_eos  # type: ignore[attr-defined]
        if not ids:
            raise ValueError(
                "no eos ids: set eos_ids = [...] in the chain, or run it through generate() / "
                "chain.prepare(tokenizer=...) so the tokenizer's eos id is used"
            )
        cached = getattr(self, "_eos_cache", None)
        if cached is None or cached[0] != ids or cached[1].device != torch.device(device or "cpu"):
            cached = (ids, torch.tensor(sorted(set(ids)), dtype=torch.int64, device=device))
            self._eos_cache = cached
        return cached[1]


def max_positions(config: Any) -> int | None:
    """The longest sequence a Hugging Face model config allows, when it states one."""
    for key in ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length", "n_ctx"):
        value = getattr(config, key, None)
        if isinstance(value, int) and value > 0:
            return value
    return None


def token_id_list(value: Any) -> list[int]:
    """Token ids given as None, an int, a list or a tensor (as configs and tokenizers give them) as a list."""
    if value is None:
        return []
    if isinstance(value, torch.Tensor):
        return [int(v) for v in value.flatten().tolist()]
    if isinstance(value, int):
        return [value]
    return [int(v) for v in value]


@attrs.define(slots=True)
class StopSetup:
    """What a generation tells its stopping criteria once, before the first step (`StoppingCriterion.prepare`).

    tokenizer / model_config / generation_config: the Hugging Face objects when known, else None.
    prompt_lengths: (B,) int64 real (unpadded) prompt length of each row; prompts are left-padded to
    `prompt_length`, so row b's new tokens are input_ids[b, prompt_length:].
    """

    batch_size: int
    prompt_length: int
    prompt_lengths: torch.Tensor
    device: torch.device
    tokenizer: Any = None
    model_config: Any = None
    generation_config: Any = None
    start_time: float = 0.0  # time.monotonic() when generation started
    # (B,) int64 each row's min_new_tokens (from the chain's min_new_tokens sampler, per request), None: all 0
    min_new_tokens: torch.Tensor | None = None

    @property
    def max_positions(self) -> int | None:
        """The model's position limit (max_position_embeddings / n_positions ...), when its config states one."""
        return max_positions(self.model_config)


@attrs.define(slots=True)
class StopContext:
    """One decoding step, seen by the criteria after the step's tokens were chosen.

    input_ids: (B, prompt_length + step) the left-padded prompts and every token generated so far, the one just
    chosen included. Rows that finished earlier carry padding after their end; the loop ignores their answer.
    token_ids: (B,) the tokens just chosen. logprobs: (B,) their log-probability under the processed
    distribution the chain sampled from. scores: (B, V) the processed scores of this step (None when the loop
    does not keep them).
    """

    input_ids: torch.Tensor
    step: int  # tokens generated so far (>= 1)
    token_ids: torch.Tensor
    setup: StopSetup
    logprobs: torch.Tensor | None = None
    scores: torch.Tensor | None = None

    @property
    def new_tokens(self) -> torch.Tensor:
        """(B, step) the generated part of input_ids."""
        return self.input_ids[:, self.setup.prompt_length :]


@attrs.frozen
class StopMatch:
    """What a text criterion matched in a row it stopped. reason: the row's finish reason ("stop_strings",
    "stop_regex:<pattern>"); text: the matched text; trailing: characters of the row's decoded new text after the
    match (text of the last token past its end). The output text ends before `text` (include_stop_str_in_output
    False, vLLM's default) or right after it (True)."""

    reason: str
    text: str
    trailing: int = 0


class StoppingCriterion(PluginClass):
    """Decides per row whether generation is finished. Criteria combine by OR; a finished row stops alone.

    `prepare(setup)` runs once per generation (resolve ids from the tokenizer, cached precomputes, timers);
    `check(ctx)` returns a (B,) bool tensor on ctx.input_ids' device, or a Python bool when the answer is the same
    for every row (length limits, timers: no tensor to build on most steps); `reason` is the finish reason
    reported for rows it stops. `is_length_limit` marks criteria that bound the length (a generation always has one).

    Text criteria (stop strings, regex stops) also implement `matches(ctx, rows)`: for the rows they stopped this
    step (host side, once per row), a StopMatch each, whose reason may name what matched; and `hold_back()`: how
    many characters of text a stream keeps back while they are active, so that it never emits text a later match
    cuts off. `min_new_tokens_gate` keeps a criterion from stopping a row before its min_new_tokens (vLLM's
    min_tokens): "tokens" fires once the row has generated that many (vLLM's check_stop: eos, stop ids,
    repetition), "text" only after more than that (vLLM's detokenizer: stop strings); None: never gated (length
    limits, timers, callables).
    """

    is_length_limit: ClassVar[bool] = False
    min_new_tokens_gate: ClassVar[str | None] = None

    @property
    def reason(self) -> str:
        return self.name

    def prepare(self, setup: StopSetup) -> None:
        """Called once per generation before the first step. Default: nothing to prepare."""

    def max_new_tokens(self, setup: StopSetup) -> int | None:
        """For length limits: the most tokens any row can get under this criterion (sizes buffers)."""
        return None

    def check(self, ctx: StopContext) -> torch.Tensor | bool:
        raise NotImplementedError

    def matches(self, ctx: StopContext, rows: list[int]) -> list[StopMatch | None]:
        """For the rows `check` stopped at this step: what matched (None: no text match, the reason is `reason`)."""
        return [None] * len(rows)

    def hold_back(self) -> int:
        """Characters a stream keeps back while this criterion is active (0: it never cuts text)."""
        return 0
