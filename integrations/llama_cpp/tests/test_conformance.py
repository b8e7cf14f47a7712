"""samplechain's samplers against llama.cpp's own, on a real model's logits.

Three greedy generations of the default GGUF model (32 steps each) through llama.cpp give 96 rows of logits (the
ones llama.cpp chose each token from) and their histories. On every row, llama.cpp's samplers run through the
low-level bindings (`samplechain_llama_cpp.reference.LlamaSamplers`, no dist: the kept candidates and a softmax over
them) and the samplechain samplers with the same parameters (`Chain.process`: the processed row before the
selector). Kept token sets must be equal and probabilities within 1e-5, apart from the documented classes
(docs/semantics.md, docs/llama_cpp.md), each detected on its row and counted, never skipped silently:

- tie:       the tokens the two keep differently share one logit that other tokens hold too (llama.cpp's sort
             leaves equal logits in any order; samplechain keeps the lowest ids);
- rounding:  llama.cpp sums the probabilities of the 49152 candidates in float32 (normaliser, running mass), whose
             error reaches about 1e-4 here, samplechain in float64: a cut on a running mass (top_p, typical) within
             NUDGE of `p` may fall one candidate apart. Detected by samplechain itself: llama.cpp's set lies between
             samplechain's sets with the parameter moved by NUDGE down and up;
- underflow: llama.cpp's typical computes the entropy from float32 probabilities, and `-p * logf(p)` is NaN for a
             finite candidate whose probability underflows to 0 (a logit more than ~104 below the row's maximum,
             e.g. after a low temperature): its kept set is then arbitrary. The rows are predicted from the logits.

xtc runs with probability 1 (both act on every row: llama.cpp's mt19937 draw and samplechain's counter-based one
only decide whether it acts). temp_ext's temperature comes from the entropy of the whole row, which llama.cpp also
sums in float32: its probabilities are compared within 1e-4, and the rows beyond 1e-5 are counted.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import pytest
import torch

from samplechain import Chain

llama_cpp = pytest.importorskip("llama_cpp")

from samplechain_llama_cpp.reference import LlamaSamplers, Spec, kept_of_scores, open_llama  # noqa: E402

pytestmark = [pytest.mark.llama_cpp, pytest.mark.slow]

PROMPTS = (
    "The history of the Roman Empire",
    "def fibonacci(n):",
    "<|im_start|>user\nList five fruits.<|im_end|>\n<|im_start|>assistant\n",
)
STEPS = 32
TOL = 1e-5  # as llama.cpp's tests/test-sampling.cpp
NUDGE = 5e-4  # the rounding class: how far llama.cpp's float32 running mass may sit from the exact one
BREAKERS = ["\n", ":", '"', "*"]  # llama.cpp's default DRY sequence breakers
UNDERFLOW_T = 0.4  # typical after this temperature: rows spanning more than ~42 logits underflow


class Generations:
    """The rows: (prompt ids, generated ids, (STEPS, V) float32 logits, llama.cpp's greedy tokens)."""

    def __init__(self, llm: Any) -> None:
        self.llm = llm
        self.vocab = int(llm.n_vocab())
        self.runs: list[tuple[list[int], list[int], np.ndarray]] = []
        for text in PROMPTS:
            llm.reset()
            prompt = llm.tokenize(text.encode(), add_bos=False, special=True)
            llm.eval(prompt)
            tokens, rows = [], []
            for _ in range(STEPS):
                rows.append(np.array(llm.scores[llm.n_tokens - 1], dtype=np.float32))
                token = int(llm.sample(temp=0.0, repeat_penalty=1.0))  # llama.cpp's greedy
                tokens.append(token)
                llm.eval([token])
            self.runs.append((list(prompt), tokens, np.stack(rows)))

    def rows(self) -> Iterator[tuple[list[int], list[int], int, np.ndarray]]:
        """(prompt, tokens, step, logits) of every row."""
        for prompt, tokens, logits in self.runs:
            for step in range(STEPS):
                yield prompt, tokens, step, logits[step]


@pytest.fixture(scope="module")
def gens() -> Iterator[Generations]:
    from samplechain.models import default_gguf_path

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # one row at a time: more threads only contend with llama.cpp's and other processes
    try:
        path = default_gguf_path()
    except Exception as exc:  # noqa: BLE001 - the model is an optional download
        pytest.skip(f"the default GGUF model is not installed: {exc}")
    llm = open_llama(path, n_ctx=512, logits_all=True, n_threads=1)
    try:
        yield Generations(llm)
    finally:
        llm.close()
        torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    from transformers import AutoTokenizer

    from samplechain.models import default_gguf_path, gguf_tokenizer_path

    return AutoTokenizer.from_pretrained(gguf_tokenizer_path(default_gguf_path()))


def _ours(entries: Sequence[dict[str, Any]], tokenizer: Any = None) -> Chain:
    chain = Chain.load({"chain": {"samplers": [*entries, {"use": "greedy"}]}})
    if tokenizer is not None:
        chain.prepare(tokenizer=tokenizer)
    return chain


def _process(chain: Chain, row: np.ndarray, prompt: list[int], tokens: list[int], step: int) -> np.ndarray:
    history = torch.tensor([prompt + tokens[:step]])
    scores = chain.process(torch.from_numpy(row)[None], history=history, prompt_lengths=torch.tensor([len(prompt)]))
    return scores[0].numpy()


def _tie(row: np.ndarray, a: np.ndarray, b: np.ndarray) -> bool:
    """The two sets differ only in tokens of one logit value that more tokens of the row hold."""
    diff = np.setxor1d(a, b)
    values = np.unique(row[diff])
    return values.size == 1 and int((row == values[0]).sum()) >= 2


def _zero_probability(pre: LlamaSamplers, row: np.ndarray) -> bool:
    """llama.cpp's typical will see a candidate of float32 probability 0: after the samplers before it (`pre`),
    a candidate is at -inf (top_n_sigma masks without removing, top_k keeps the masked ones) or its softmax
    underflows (a logit ~104 below the maximum). Its entropy, `-p * logf(p)` summed, is then NaN."""
    cur = pre.apply(row)
    x = cur["logit"].astype(np.float32)
    e = np.exp(x - x.max(), dtype=np.float32)
    return bool(((e / e.sum(dtype=np.float32)) == 0).any())


class Case:
    """One comparison: llama.cpp's specs against samplechain's entries; `cut` names the entry field whose
    NUDGE-moved value tells the rounding class, `typical_at` the index of a typical in `specs` (the underflow
    class)."""

    def __init__(
        self,
        specs: Sequence[Spec],
        entries: Sequence[dict[str, Any]],
        *,
        cut: tuple[int, str] | None = None,
        tol: float = TOL,
        typical_at: int | None = None,
    ) -> None:
        self.specs, self.entries, self.cut, self.tol = list(specs), list(entries), cut, tol
        self.typical_at = typical_at

    def nudged(self, sign: float) -> list[dict[str, Any]]:
        assert self.cut is not None
        index, field = self.cut
        entries = [dict(e) for e in self.entries]
        entries[index][field] += sign * NUDGE
        return entries


CASES = {
    "top_k": Case([("top_k", {"k": 40})], [{"use": "top_k", "k": 40}]),
    "top_p": Case([("top_p", {"p": 0.9})], [{"use": "top_p", "p": 0.9}], cut=(0, "p")),
    "min_p": Case([("min_p", {"p": 0.05})], [{"use": "min_p", "p": 0.05}], cut=(0, "p")),
    "typical": Case([("typical", {"p": 0.9})], [{"use": "typical", "p": 0.9}], cut=(0, "p"), typical_at=0),
    "temp": Case([("temp", {"t": 0.7})], [{"use": "temperature", "t": 0.7}]),
    "temp_ext": Case(
        [("temp_ext", {"t": 0.8, "delta": 0.5, "exponent": 1.0})],
        [{"use": "temp_ext", "t": 0.8, "delta": 0.5, "exponent": 1.0}],
        tol=1e-4,
    ),
    "top_n_sigma": Case([("top_n_sigma", {"n": 1.0})], [{"use": "top_n_sigma", "n": 1.0}], cut=(0, "n")),
    "xtc": Case(
        [("xtc", {"probability": 1.0, "threshold": 0.1, "seed": 1})],
        [{"use": "xtc", "probability": 1.0, "threshold": 0.1}],
        cut=(0, "threshold"),
    ),
    "penalties": Case(
        [("penalties", {"last_n": 64, "repeat": 1.3, "frequency": 0.2, "presence": 0.3})],
        [{"use": "penalties", "repeat": 1.3, "frequency": 0.2, "presence": 0.3, "last_n": 64}],
    ),
    "typical after a low temperature": Case(
        [("temp", {"t": UNDERFLOW_T}), ("typical", {"p": 0.9})],
        [{"use": "temperature", "t": UNDERFLOW_T}, {"use": "typical", "p": 0.9}],
        cut=(1, "p"),
        typical_at=1,
    ),
}


class Outcome:
    """Per-row results of one comparison: counts per class, the largest probability difference on rows with the
    same set, the rows no class explains, and how many rows the underflow class predicts."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.counts: Counter[str] = Counter()
        self.worst = 0.0
        self.unexplained: list[tuple[int, int, int, int]] = []
        self.predicted = 0

    def line(self) -> str:
        counts = ", ".join(f"{n} {k}" for k, n in sorted(self.counts.items()))
        return (
            f"conformance {self.name}: {counts}; {self.predicted} rows where typical sees a probability 0; "
            f"max |dp| on equal sets {self.worst:.2g}"
        )


class Sides:
    """llama.cpp's chain (and the part before its typical, for the underflow class) with the same history."""

    def __init__(self, vocab: int, specs: Sequence[Spec], typical_at: int | None, prompt: list[int]) -> None:
        self.ref = LlamaSamplers(vocab, specs)
        self.pre = None if typical_at is None else LlamaSamplers(vocab, specs[:typical_at])
        self.accept(prompt)

    def accept(self, tokens: list[int]) -> None:
        for chain in (self.ref, self.pre):
            if chain is not None:
                chain.accept(tokens)

    def close(self) -> None:
        for chain in (self.ref, self.pre):
            if chain is not None:
                chain.close()


def compare(
    gens: Generations,
    name: str,
    specs: Sequence[Spec],
    chain: Chain,
    *,
    case: Case | None = None,
    store: Any = None,
    typical_at: int | None = None,
) -> Outcome:
    """llama.cpp's `specs` and samplechain's `chain` on every row (history accepted into llama.cpp's chain as
    llama-server does: the prompt, then each token); a row whose sets differ is put in its class."""
    outcome = Outcome(name)
    nudged = [_ours(case.nudged(sign)) for sign in (-1.0, 1.0)] if case is not None and case.cut else []
    tol = TOL if case is None else case.tol
    typical_at = typical_at if case is None else case.typical_at
    for index, (prompt, tokens, logits) in enumerate(gens.runs):
        rid = f"run{index}"
        if store is not None:
            store.add(rid, PRESET_PARAMS if name.endswith("switched on") else {})
        sides = Sides(gens.vocab, specs, typical_at, prompt)
        try:
            for step in range(STEPS):
                row = logits[step]
                theirs, p_theirs = sides.ref.kept(row)
                defect = sides.pre is not None and _zero_probability(sides.pre, row)
                outcome.predicted += defect
                sides.accept([tokens[step]])
                scores = chain.process(
                    torch.from_numpy(row)[None],
                    store,
                    None if store is None else [rid],
                    history=torch.tensor([prompt + tokens[:step]]),
                    prompt_lengths=torch.tensor([len(prompt)]),
                )
                ours, p_ours = kept_of_scores(scores[0].numpy())
                same = np.array_equal(theirs, ours)
                dp = float(np.abs(p_theirs - p_ours).max()) if same else np.inf
                if same and dp <= tol:
                    outcome.worst = max(outcome.worst, dp)
                    outcome.counts["same" if dp <= TOL else f"same, |dp| in ({TOL:g}, {tol:g}]"] += 1
                elif defect:
                    outcome.counts["underflow"] += 1
                elif not same and _tie(row, theirs, ours):
                    outcome.counts["tie"] += 1
                elif not same and nudged and _between(theirs, [_kept(c, row, prompt, tokens, step) for c in nudged]):
                    outcome.counts["rounding"] += 1
                else:
                    outcome.unexplained.append((index, step, theirs.size, ours.size))
        finally:
            sides.close()
    print(outcome.line())
    return outcome


def _kept(chain: Chain, row: np.ndarray, prompt: list[int], tokens: list[int], step: int) -> np.ndarray:
    return kept_of_scores(_process(chain, row, prompt, tokens, step))[0]


def _between(theirs: np.ndarray, bounds: list[np.ndarray]) -> bool:
    """llama.cpp's set lies between samplechain's sets with the cut parameter NUDGE below and above its value (the
    filters' kept sets grow or shrink monotonically with it)."""
    small, large = sorted(bounds, key=len)
    return bool(np.isin(small, theirs).all() and np.isin(theirs, large).all())


@pytest.mark.parametrize("name", list(CASES))
def test_sampler_alone(gens: Generations, name: str) -> None:
    case = CASES[name]
    outcome = compare(gens, name, case.specs, _ours(case.entries), case=case)
    assert not outcome.unexplained, (outcome.line(), outcome.unexplained)
    if name == "typical after a low temperature":  # the defect shows on exactly the rows it predicts
        assert 0 < outcome.predicted < len(PROMPTS) * STEPS
        assert outcome.counts["underflow"] == outcome.predicted
    elif name == "typical":  # the model's logits span less than 104: nothing underflows at temperature 1
        assert outcome.predicted == 0
    compared = len(PROMPTS) * STEPS - outcome.counts["underflow"]
    assert sum(n for k, n in outcome.counts.items() if k.startswith("same")) >= 0.9 * compared, outcome.line()


def test_dry(gens: Generations, tokenizer: Any) -> None:
    """DRY with llama.cpp's default breakers, resolved by llama.cpp from its vocabulary and by samplechain from the
    same model's tokenizer."""
    args = {"multiplier": 0.8, "base": 1.75, "allowed_length": 2, "penalty_last_n": 256}
    specs = [("dry", {**args, "breakers": BREAKERS, "vocab": gens.llm._model.vocab})]
    chain = _ours([{"use": "dry", **args, "breakers": BREAKERS}], tokenizer)
    outcome = compare(gens, "dry", specs, chain)
    assert not outcome.unexplained, outcome.unexplained
    assert outcome.counts["same"] == len(PROMPTS) * STEPS


PRESET_PARAMS = {
    "repeat_penalty": 1.1,
    "frequency_penalty": 0.1,
    "presence_penalty": 0.1,
    "dry_multiplier": 0.8,
    "dry_penalty_last_n": 256,
    "typical_p": 0.95,
    "top_n_sigma": 2.0,
    "temperature": 0.7,
}


def _preset_specs(gens: Generations, on: bool) -> list[Spec]:
    """llama.cpp's `common_sampler` chain for the preset's values (`on`: PRESET_PARAMS's), without dist."""
    p = PRESET_PARAMS
    return [
        (
            "penalties",
            {"last_n": 64, "repeat": p["repeat_penalty"], "frequency": 0.1, "presence": 0.1} if on else {"last_n": 64},
        ),
        (
            "dry",
            {
                "multiplier": 0.8 if on else 0.0,
                "base": 1.75,
                "allowed_length": 2,
                "penalty_last_n": 256 if on else -1,
                "breakers": BREAKERS,
                "vocab": gens.llm._model.vocab,
            },
        ),
        ("top_n_sigma", {"n": 2.0 if on else -1.0}),
        ("top_k", {"k": 40}),
        ("typical", {"p": 0.95 if on else 1.0}),
        ("top_p", {"p": 0.95}),
        ("min_p", {"p": 0.05}),
        ("xtc", {"probability": 0.0, "threshold": 0.1}),
        ("temp_ext", {"t": 0.7 if on else 0.8, "delta": 0.0, "exponent": 1.0}),
    ]


@pytest.mark.parametrize("on", [False, True], ids=["defaults", "switched on"])
def test_preset_llama_cpp(gens: Generations, tokenizer: Any, on: bool) -> None:
    """`preset:llama.cpp` without its dist (`Chain.process`) against the same chain in llama.cpp; switched on, its
    typical sees the candidates top_n_sigma masked (kept at -inf by llama.cpp's top_k): the underflow class."""
    chain = Chain.load("preset:llama.cpp")
    chain.prepare(tokenizer=tokenizer)
    name = "preset:llama.cpp " + ("switched on" if on else "defaults")
    outcome = compare(gens, name, _preset_specs(gens, on), chain, store=chain.new_store(), typical_at=4 if on else None)
    assert not outcome.unexplained, (outcome.line(), outcome.unexplained)
    assert outcome.counts["same"] + outcome.counts["underflow"] == len(PROMPTS) * STEPS, outcome.line()
    assert outcome.counts["underflow"] <= outcome.predicted


def test_greedy_whole_generations(gens: Generations) -> None:
    """samplechain's greedy over llama.cpp's logits, step by step, is llama.cpp's greedy generation."""
    chain = Chain.load("preset:greedy")
    for _, tokens, logits in gens.runs:
        ours = chain.sample(torch.from_numpy(logits)).token_ids.tolist()
        assert ours == tokens
        with LlamaSamplers(gens.vocab, [("greedy", {})]) as ref:
            for step in range(STEPS):
                cur = ref.apply(logits[step])
                assert int(cur["id"][ref.array.selected]) == tokens[step]
