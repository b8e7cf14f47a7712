"""cfg.v1 against transformers' UnbatchedClassifierFreeGuidanceLogitsProcessor: the formula on random logits
(probabilities within 1e-5), and whole generations on the embedded model equal model.generate(guidance_scale=...)
with and without negative_prompt_ids (greedy: the same tokens; scores within 1e-4)."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer
from transformers.generation.logits_process import UnbatchedClassifierFreeGuidanceLogitsProcessor

from samplechain import Chain, ConfigError, SamplingError
from samplechain.generation import generate
from samplechain.models import tiny_model_path


def chain(**params):
    return Chain.load({"samplers": [{"use": "cfg", **params}, {"use": "greedy"}]})


class FixedModel:
    """What the transformers processor calls for the unconditional logits: returns fixed logits."""

    def __init__(self, logits):
        self.logits = logits

    def __call__(self, input_ids, **kwargs):
        from transformers.modeling_outputs import CausalLMOutputWithPast

        return CausalLMOutputWithPast(logits=self.logits[:, None, :])


@pytest.mark.parametrize("scale", (0.5, 1.5, 3.0))
@pytest.mark.parametrize("dtype", (torch.float32, torch.float16, torch.bfloat16))
def test_formula_matches_transformers(scale, dtype):
    g = torch.Generator().manual_seed(int(scale * 10))
    cond, uncond = (torch.randn(4, 300, generator=g) * 3).to(dtype), torch.randn(4, 300, generator=g) * 3
    ref = UnbatchedClassifierFreeGuidanceLogitsProcessor(scale, FixedModel(uncond))(
        torch.zeros(4, 3, dtype=torch.long), cond.float()
    )
    ours = chain(scale=scale).sample(cond, unconditional_logits=uncond, return_scores=True).scores
    assert torch.allclose(torch.softmax(ours, -1), torch.softmax(ref, -1), atol=1e-5)


def test_per_row_scale_equals_rows_alone_and_scale_one_is_a_no_op():
    g = torch.Generator().manual_seed(1)
    cond, uncond = torch.randn(3, 50, generator=g), torch.randn(3, 50, generator=g)
    c = chain()
    store = c.new_store()
    scales = [1.0, 2.0, 0.5]
    for i, s in enumerate(scales):
        store.add(f"r{i}", {"guidance_scale": s})
    batch = c.sample(cond, store, ["r0", "r1", "r2"], unconditional_logits=uncond, return_scores=True).scores
    for i, s in enumerate(scales):
        alone = chain(scale=s).sample(cond[i : i + 1], unconditional_logits=uncond[i : i + 1], return_scores=True)
        assert torch.equal(batch[i], alone.scores[0])
    assert torch.equal(batch[0], cond[0])


def test_after_a_filter_only_the_survivors_are_guided():
    g = torch.Generator().manual_seed(2)
    cond, uncond = torch.randn(2, 40, generator=g), torch.randn(2, 40, generator=g)
    c = Chain.load({"samplers": [{"use": "top_k", "k": 5}, {"use": "cfg", "scale": 2.0}, {"use": "greedy"}]})
    out = c.sample(cond, unconditional_logits=uncond, return_scores=True).scores
    assert int(torch.isfinite(out).sum()) == 10
    top = cond.topk(5).indices
    full = chain(scale=2.0).sample(cond, unconditional_logits=uncond, return_scores=True).scores
    # renormalised among the survivors: the same distribution over them as guiding the full row
    assert torch.allclose(torch.softmax(out.gather(1, top), -1), torch.softmax(full.gather(1, top), -1), atol=1e-6)


def test_missing_unconditional_logits_is_a_clear_error():
    with pytest.raises(SamplingError, match="unconditional_logits"):
        chain(scale=2.0).sample(torch.zeros(1, 5))
    with pytest.raises(SamplingError, match="shape"):
        chain(scale=2.0).sample(torch.zeros(1, 5), unconditional_logits=torch.zeros(1, 4))
    with pytest.raises(ConfigError, match="scale"):
        chain(scale=-1.0)


@pytest.fixture(scope="module")
def lm():
    path = tiny_model_path()
    return AutoModelForCausalLM.from_pretrained(path).eval(), AutoTokenizer.from_pretrained(path)


@pytest.mark.parametrize("negative", (None, "The following example"))
def test_generation_equals_transformers_guidance(lm, negative):
    model, tok = lm
    prompt = tok("In Python, a list is", return_tensors="pt")
    kwargs = {}
    if negative is not None:
        kwargs["negative_prompt_ids"] = tok(negative, return_tensors="pt")["input_ids"]
    ref = model.generate(
        **prompt,
        do_sample=False,
        guidance_scale=1.8,
        max_new_tokens=16,
        output_scores=True,
        return_dict_in_generate=True,
        pad_token_id=tok.eos_token_id,
        **kwargs,
    )
    ours = generate(
        model,
        tok,
        "In Python, a list is",
        chain=chain(scale=1.8),
        max_new_tokens=16,
        output_scores=True,
        negative_prompt=negative,
    )
    plain = generate(model, tok, "In Python, a list is", chain=Chain.load("preset:greedy"), max_new_tokens=16)
    n = ref.sequences.shape[1]
    assert torch.equal(ours.sequences[0, :n], ref.sequences[0])
    assert not torch.equal(ours.sequences, plain.sequences), "guidance should change this greedy continuation"
    for mine, theirs in zip(ours.scores, ref.scores):
        assert torch.allclose(torch.log_softmax(mine, -1), torch.log_softmax(theirs, -1), atol=1e-4)


def test_negative_prompt_per_request_and_from_the_chain(lm):
    model, tok = lm
    prompts = ["In Python, a list is", "A dictionary maps"]
    both = generate(model, tok, prompts, chain=chain(scale=2.0), max_new_tokens=8, negative_prompt=["The list", "Keys"])
    for i, (p, neg) in enumerate(zip(prompts, ["The list", "Keys"])):
        alone = generate(model, tok, p, chain=chain(scale=2.0), max_new_tokens=8, negative_prompt=neg)
        assert both.texts[i] == alone.texts[0]
    from_chain = generate(model, tok, prompts[0], chain=chain(scale=2.0, negative_prompt="The list"), max_new_tokens=8)
    assert from_chain.texts[0] == both.texts[0]
    with pytest.raises(ConfigError, match="no guidance sampler"):
        generate(model, tok, prompts[0], chain=Chain.load("preset:greedy"), negative_prompt="x", max_new_tokens=2)
