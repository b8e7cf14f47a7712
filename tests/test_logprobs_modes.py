"""Logprobs at any stage of a chain (`chain.sample(logprobs_at=...)`, `generate(logprobs_mode=...)`).

Every mode is checked against the distribution computed independently: transformers' processors applied one by
one for chains they have (temperature -> top_k -> top_p; penalties -> min_p -> temperature), and for presets the
scores `Chain.process` gives for the chain cut after that entry (the plain executor, no stage split, no fused
tail). The chosen token's logprob (or logit) and the top n must agree, and the tokens must not depend on the mode.
"""

from __future__ import annotations

import copy

import pytest
import torch
from transformers.generation import logits_process as tp

from samplechain import Chain, ConfigError
from samplechain.engine.discovery import get_host
from samplechain.generation import generate
from samplechain.tools.testing import tiny_gpt2

B, V, PROMPT, N = 5, 400, 6, 5

TEMP_TOPK_TOPP = {
    "samplers": [
        {"use": "temperature", "t": 0.7, "id": "temp"},
        {"use": "top_k", "k": 20},
        {"use": "top_p", "p": 0.9},
        {"use": "dist", "seed": 11},
    ]
}
PENALTIES_MINP = {
    "samplers": [
        {"use": "penalties", "repeat": 1.3, "scope": "transformers"},
        {"use": "min_p", "p": 0.05},
        {"use": "temperature", "t": 1.3},
        {"use": "dist", "seed": 4},
    ]
}


def inputs(seed: int, vocab: int = V) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(B, vocab, generator=g) * 3
    history = torch.randint(0, 60, (B, PROMPT + 3), generator=g)
    return logits, history


def hf_stages(processors, logits: torch.Tensor, history: torch.Tensor) -> list[torch.Tensor]:
    """The logits as given, then after each processor in turn (transformers' own implementations)."""
    out = [logits.clone()]
    for proc in processors:
        out.append(proc(history, out[-1].clone()))
    return out


def prefix_stages(table: dict, logits: torch.Tensor, history: torch.Tensor) -> list[torch.Tensor]:
    """The logits as given, then the processed scores of the chain cut right after each entry but the selector."""
    samplers = table["samplers"]
    out = [logits.clone()]
    for i in range(len(samplers) - 1):
        cut = {**table, "samplers": copy.deepcopy(samplers[: i + 1]) + [{"use": "dist"}]}
        out.append(Chain.load(cut).process(logits, history=history, prompt_lengths=torch.full((B,), PROMPT)))
    return out


def preset(name: str, **changes: dict) -> dict:
    table = copy.deepcopy({k: v for k, v in get_host().registry.presets[name].items() if k != "summary"})
    for entry in table["samplers"]:
        entry.update(changes.get(entry["use"], {}))
    return table


CASES = {
    "temp_topk_topp": (
        TEMP_TOPK_TOPP,
        lambda: [tp.TemperatureLogitsWarper(0.7), tp.TopKLogitsWarper(20), tp.TopPLogitsWarper(0.9)],
    ),
    "penalties_minp": (
        PENALTIES_MINP,
        lambda: [tp.RepetitionPenaltyLogitsProcessor(1.3), tp.MinPLogitsWarper(0.05), tp.TemperatureLogitsWarper(1.3)],
    ),
    "preset_llama_cpp": (preset("llama.cpp", penalties={"repeat": 1.2}, top_k={"k": 60}, dist={"seed": 9}), None),
    "preset_vllm": (preset("vllm", dist={"seed": 9}), None),
}


def names_and_stages(table: dict) -> list[tuple[str, int]]:
    """(logprobs_at name, index into the stage list) for raw, every entry but the selector, and processed."""
    ids = [e.get("id", e["use"]) for e in table["samplers"]]
    last = len(ids) - 1
    return [("raw", 0)] + [(ids[i], i + 1) for i in range(last)] + [(ids[last], last), ("processed", last)]


def expected(
    stage: torch.Tensor, tokens: torch.Tensor, as_logits: bool
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(chosen value, top-N values, top-N ids) under one stage's scores, in float64."""
    x = stage.double()
    dist = x if as_logits else torch.log_softmax(x, dim=-1)
    values, ids = dist.topk(N, dim=-1)
    return dist.gather(1, tokens[:, None]).squeeze(1), values, ids


def check(out, stage: torch.Tensor, tokens: torch.Tensor, as_logits: bool, label: str) -> None:
    chosen, values, ids = expected(stage, tokens, as_logits)
    torch.testing.assert_close(out.logprobs.double(), chosen, atol=2e-5, rtol=1e-5, msg=label)
    got_values, got_ids = out.top_logprobs
    torch.testing.assert_close(got_values.double(), values, atol=2e-5, rtol=1e-5, msg=label)
    finite = values > float("-inf")
    assert torch.equal(got_ids[finite], ids[finite]), label
    rank = (stage.double() >= stage.double().gather(1, tokens[:, None])).sum(dim=1)  # vLLM's selected_token_ranks
    assert torch.equal(out.ranks, rank), label


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("vocab", [V, 1 << 18])  # the wide one takes the executor's fusions in the default mode
def test_every_stage_matches_the_independent_reference(case, vocab):
    table, processors = CASES[case]
    logits, history = inputs(list(CASES).index(case), vocab)
    stages = hf_stages(processors(), logits, history) if processors else prefix_stages(table, logits, history)
    chain = Chain.load(table)
    extra = {"history": history, "prompt_lengths": torch.full((B,), PROMPT)}
    default = chain.sample(logits, **extra)
    for name, index in names_and_stages(table):
        for suffix, as_logits in (("", False), (":logprobs", False), (":logits", True)):
            out = chain.sample(logits, logprobs_at=name + suffix, top_logprobs=N, **extra)
            assert torch.equal(out.token_ids, default.token_ids), name + suffix
            check(out, stages[index], default.token_ids, as_logits, f"{case} {name}{suffix}")
    processed = stages[-1]
    for vllm_name, stage, as_logits in (
        ("raw_logprobs", stages[0], False),
        ("raw_logits", stages[0], True),
        ("processed_logprobs", processed, False),
        ("processed_logits", processed, True),
    ):
        out = chain.sample(logits, logprobs_at=vllm_name, top_logprobs=N, **extra)
        assert torch.equal(out.token_ids, default.token_ids), vllm_name
        check(out, stage, default.token_ids, as_logits, f"{case} {vllm_name}")


def test_the_default_is_the_processed_distribution_unchanged():
    logits, _ = inputs(1)
    chain = Chain.load(TEMP_TOPK_TOPP)
    default = chain.sample(logits)
    asked = chain.sample(logits, logprobs_at="processed", top_logprobs=3)
    assert default.top_logprobs is None
    assert torch.equal(default.token_ids, asked.token_ids)
    torch.testing.assert_close(default.logprobs, asked.logprobs, atol=0, rtol=0)


def test_rows_may_ask_for_different_stages():
    logits, _ = inputs(2)
    chain = Chain.load(TEMP_TOPK_TOPP)
    modes = ["raw", "temp", "processed_logits", "top_k:logits", "processed"]
    mixed = chain.sample(logits, logprobs_at=modes, top_logprobs=N)
    for row, mode in enumerate(modes):
        alone = chain.sample(logits, logprobs_at=mode, top_logprobs=N)
        assert mixed.token_ids[row] == alone.token_ids[row]
        torch.testing.assert_close(mixed.logprobs[row], alone.logprobs[row], atol=0, rtol=0)
        torch.testing.assert_close(mixed.top_logprobs[0][row], alone.top_logprobs[0][row], atol=0, rtol=0)
        assert torch.equal(mixed.top_logprobs[1][row], alone.top_logprobs[1][row])


def test_an_entry_is_named_by_its_id_or_its_unique_plugin_name():
    chain = Chain.load(TEMP_TOPK_TOPP)
    assert chain.logprobs_stage("temp") == chain.logprobs_stage("temperature") == (0, False)
    assert chain.logprobs_stage("top_k.v1:logits") == (1, True)
    assert (
        chain.logprobs_stage("top_p") == chain.logprobs_stage("dist") == chain.logprobs_stage("processed") == (3, False)
    )
    assert chain.logprobs_stage("raw_logits") == (-1, True)


def test_an_unknown_stage_is_an_error_listing_the_entries():
    chain = Chain.load(TEMP_TOPK_TOPP)
    with pytest.raises(ConfigError, match=r"'tmp'.*did you mean 'temp'.*'top_k' \(samplers\[1\], top_k.v1\)"):
        chain.sample(torch.zeros(1, 50), logprobs_at="tmp")
    with pytest.raises(ConfigError, match="must be 'logprobs' or 'logits'"):
        chain.sample(torch.zeros(1, 50), logprobs_at="temp:probs")
    twice = Chain.load(
        {"samplers": [{"use": "top_k", "k": 5}, {"use": "top_k", "k": 3, "id": "second"}, {"use": "dist"}]}
    )
    with pytest.raises(ConfigError, match=r"2 entries are 'top_k.v1' \(samplers\[0\], samplers\[1\]\): name one"):
        twice.logprobs_stage("top_k.v1")


# ----------------------------------------------------------------- generate()
@pytest.fixture(scope="module")
def model():
    return tiny_gpt2(300, seed=0)


def run(model, **kwargs):
    ids = torch.tensor([[5, 6, 7, 8], [9, 10, 11, 12]])
    return generate(
        model,
        input_ids=ids,
        attention_mask=torch.ones_like(ids),
        chain=TEMP_TOPK_TOPP,
        seed=3,
        max_new_tokens=5,
        ignore_eos=True,
        pad_token_id=0,
        output_logits=True,
        output_scores=True,
        top_logprobs=3,
        **kwargs,
    )


@pytest.mark.parametrize(
    "mode, stage, as_logits",
    [
        ("raw", lambda raw, scores: raw, False),
        ("raw_logits", lambda raw, scores: raw, True),
        ("temp", lambda raw, scores: raw / 0.7, False),
        ("top_k:logits", lambda raw, scores: tp.TopKLogitsWarper(20)(None, raw / 0.7), True),
        ("processed_logprobs", lambda raw, scores: scores, False),
        ("processed_logits", lambda raw, scores: scores, True),
    ],
)
def test_generate_reports_the_mode_it_is_given(model, mode, stage, as_logits):
    base = run(model)
    out = run(model, logprobs_mode=mode)
    assert torch.equal(out.sequences, base.sequences)
    new = out.sequences[:, out.prompt_length :]
    for step, (raw, scores) in enumerate(zip(out.logits, out.scores)):
        chosen, values, ids = expected(stage(raw, scores), new[:, step], as_logits)
        torch.testing.assert_close(out.logprobs[:, step].double(), chosen, atol=2e-5, rtol=1e-5)
        torch.testing.assert_close(out.top_logprobs[step][0].double(), values[:, :3], atol=2e-5, rtol=1e-5)


def test_generate_takes_one_mode_per_prompt(model):
    out = run(model, logprobs_mode=["raw", "processed"])
    raw, processed = run(model, logprobs_mode="raw"), run(model)
    torch.testing.assert_close(out.logprobs[0], raw.logprobs[0], atol=0, rtol=0)
    torch.testing.assert_close(out.logprobs[1], processed.logprobs[1], atol=0, rtol=0)


def test_each_prompt_of_a_mixed_batch_names_an_entry_of_its_own_chain(model):
    ids = torch.tensor([[5, 6, 7, 8], [9, 10, 11, 12]])
    kwargs = dict(
        input_ids=ids,
        attention_mask=torch.ones_like(ids),
        seed=3,
        max_new_tokens=4,
        ignore_eos=True,
        pad_token_id=0,
        output_logits=True,
    )
    out = generate(
        model, chain=[TEMP_TOPK_TOPP, PENALTIES_MINP], logprobs_mode=["temp", "min_p:logits"], top_logprobs=2, **kwargs
    )
    new = out.sequences[:, out.prompt_length :]
    for step, raw in enumerate(out.logits):
        temp = torch.log_softmax(raw[0].double() / 0.7, dim=-1)
        torch.testing.assert_close(out.logprobs[0, step].double(), temp[new[0, step]], atol=2e-5, rtol=1e-5)
    with pytest.raises(ConfigError, match="logprobs_at = 'temp'"):  # the second chain has no entry 'temp'
        generate(model, chain=[TEMP_TOPK_TOPP, PENALTIES_MINP], logprobs_mode=["temp", "temp"], **kwargs)


def test_generate_checks_the_mode_before_running(model):
    with pytest.raises(ConfigError, match="logprobs_at = 'tmp'"):
        run(model, logprobs_mode="tmp")
    with pytest.raises(ConfigError, match="one per prompt"):
        run(model, logprobs_mode=["raw"])


def test_the_cli_takes_a_logprobs_mode(tmp_path, capsys):
    import json

    from samplechain.cli import main
    from samplechain.tools.testing import byte_bpe_tokenizer

    tiny_gpt2(300, seed=3).save_pretrained(tmp_path)
    byte_bpe_tokenizer(300).save_pretrained(tmp_path)
    args = ["generate", "The quick", "--model", str(tmp_path), "--max-new-tokens", "4", "--seed", "5", "--json"]
    rows = []
    for mode in ("processed", "raw_logits"):
        assert main(args + ["--logprobs-mode", mode]) == 0
        rows.append(json.loads(capsys.readouterr().out)["outputs"][0])
    assert rows[0]["token_ids"] == rows[1]["token_ids"]
    assert all(v <= 0 for v in rows[0]["logprobs"]) and any(v > 0 for v in rows[1]["logprobs"])
    assert main(args + ["--logprobs-mode", "tmp"]) != 0
