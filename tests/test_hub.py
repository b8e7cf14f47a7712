"""custom_generate repositories opened by samplechain.integrations.hub: trust first, requirements checked with packaging, the
repo's own package imported (relative imports), its sampler modules and chain.toml for its run only; the same
folders run through transformers' own model.generate(custom_generate=FOLDER)."""

from __future__ import annotations

import shutil
import sys
import warnings
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

import samplechain
from samplechain import ConfigError
from samplechain.integrations.hub import UnpinnedRevisionWarning, load_custom_generate
from samplechain.models import tiny_model_path

CONTRIB = Path(__file__).resolve().parents[1] / "contrib"
LEFT = CONTRIB / "custom-generate-left-padding"
CHAIN_REPO = CONTRIB / "custom-generate-chain"
BAD = CONTRIB / "custom-generate-bad-requirements"


@pytest.fixture(scope="module")
def lm():
    path = tiny_model_path()
    return AutoModelForCausalLM.from_pretrained(path).eval(), AutoTokenizer.from_pretrained(path)


def _repo_modules() -> set[str]:
    return {m for m in sys.modules if m.startswith("samplechain_custom_generate_")}


def test_nothing_runs_without_trust_remote_code_local_folders_included():
    before = _repo_modules()
    with pytest.raises(ConfigError, match=r"custom_generate/generate\.py.*trust_remote_code=True"):
        load_custom_generate(LEFT)
    with pytest.raises(ConfigError, match="trust_remote_code"):
        load_custom_generate(BAD)  # its generate.py raises at import: it must not have been imported
    assert _repo_modules() == before


def test_unsatisfiable_requirements_list_every_failure_before_any_import():
    with pytest.raises(ImportError) as err:
        load_custom_generate(BAD, trust_remote_code=True)
    text = str(err.value)
    assert "Missing requirements in your local environment" in text
    assert "foo (installed: None)" in text and "bar==0.0.0 (installed: None)" in text
    assert f"torch>=99.0 (installed: {torch.__version__})" in text
    assert "without the extra 'no-such-extra'" in text
    assert "never-on-this-python" not in text  # its marker excludes this environment


def test_missing_generate_and_syntax_errors_are_clear(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError, match="does not contain a `custom_generate` subdirectory"):
        load_custom_generate(tmp_path / "empty", trust_remote_code=True)
    broken = tmp_path / "broken" / "custom_generate"
    broken.mkdir(parents=True)
    (broken / "generate.py").write_text("def generate(model, **kw):\n    return (\n")
    with pytest.raises(ConfigError, match=r"syntax error at line \d"):
        load_custom_generate(tmp_path / "broken", trust_remote_code=True)
    with pytest.raises(ConfigError, match="no such folder"):
        load_custom_generate(tmp_path / "nope", trust_remote_code=True)


def test_left_padding_example_runs_through_samplechain_and_transformers_alike(lm):
    model, tok = lm
    inputs = tok("In Python, a list is", return_tensors="pt")
    repo = load_custom_generate(LEFT, trust_remote_code=True)
    ours = repo.generate(model, input_ids=inputs["input_ids"], left_padding=5, max_new_tokens=8)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        theirs = model.generate(
            **inputs, custom_generate=str(LEFT), trust_remote_code=True, left_padding=5, max_new_tokens=8
        )
    assert torch.equal(ours, theirs)
    assert ours[0, :5].tolist() == [tok.eos_token_id] * 5  # the pad (eos here) tokens in front
    assert ours.shape[1] == 5 + inputs["input_ids"].shape[1] + 8
    with pytest.raises(ValueError, match="left_padding must be an integer"):  # from checks.py, imported relatively
        repo.generate(model, input_ids=inputs["input_ids"], left_padding=-1, max_new_tokens=2)


def test_repo_sampler_and_chain_run_for_that_run_only(lm):
    model, tok = lm
    host = samplechain.get_host()
    repo = load_custom_generate(CHAIN_REPO, trust_remote_code=True)
    assert [s.name for s in repo.chain.samplers] == ["ban_digits", "top_k", "top_p", "temperature", "dist"]
    assert "ban_digits" not in host.registered("sampler")
    prompt = "Version 3.11 of Python was released in"
    out = repo.generate(model, tok, prompt, max_new_tokens=24, seed=3, ignore_eos=True)
    assert "ban_digits" not in host.registered("sampler")
    new_text = tok.decode(out.sequences[0, out.prompt_length :])
    assert not any(c.isdigit() for c in new_text), new_text
    plain = samplechain.generation.generate(
        model, tok, prompt, chain="preset:llama.cpp", max_new_tokens=24, seed=3, ignore_eos=True
    )
    assert any(c.isdigit() for c in tok.decode(plain.sequences[0])), "the prompt has digits: the ban is visible"
    # transformers' loader copies only the .py files: the chain file is given explicitly there
    inputs = tok(prompt, return_tensors="pt")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        theirs = model.generate(
            **inputs,
            custom_generate=str(CHAIN_REPO),
            trust_remote_code=True,
            tokenizer=tok,
            chain=str(CHAIN_REPO / "custom_generate" / "chain.toml"),
            max_new_tokens=24,
            seed=3,
            pad_token_id=tok.eos_token_id,
            eos_token_id=None,
        )
    assert torch.equal(theirs[0], out.sequences[0])
    assert "ban_digits" not in host.registered("sampler")


def _fake_cache(cache: Path, repo_id: str, source: Path, commit: str) -> None:
    """The layout huggingface_hub's cache has: refs/main -> commit, snapshots/<commit>/files."""
    base = cache / f"models--{repo_id.replace('/', '--')}"
    (base / "refs").mkdir(parents=True)
    (base / "refs" / "main").write_text(commit)
    shutil.copytree(source, base / "snapshots" / commit)


def test_repo_ids_open_from_the_local_cache_offline_and_unpinned_revisions_warn(tmp_path, lm):
    model, tok = lm
    commit = "0123456789abcdef0123456789abcdef01234567"
    _fake_cache(tmp_path, "community/left-padding", LEFT, commit)
    with pytest.warns(UnpinnedRevisionWarning, match="pin revision= to a commit"):
        repo = load_custom_generate("community/left-padding", trust_remote_code=True, cache_dir=tmp_path)
    with warnings.catch_warnings():
        warnings.simplefilter("error", UnpinnedRevisionWarning)
        pinned = load_custom_generate(
            "community/left-padding", revision=commit, trust_remote_code=True, cache_dir=tmp_path
        )
    ids = tok("A tuple", return_tensors="pt")["input_ids"]
    assert torch.equal(
        repo.generate(model, input_ids=ids, left_padding=2, max_new_tokens=3),
        pinned.generate(model, input_ids=ids, left_padding=2, max_new_tokens=3),
    )
    with pytest.raises(ConfigError, match="not in the local Hugging Face cache and samplechain never downloads"):
        load_custom_generate("community/absent", revision=commit, trust_remote_code=True, cache_dir=tmp_path)
