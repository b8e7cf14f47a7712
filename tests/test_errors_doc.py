"""docs/errors.md is a specification: every row of its table is triggered here and must raise what it says.

Each row's `id` names a trigger function below (registered with @case). The test raises the case, checks the
error class named in the row and that the documented message (split on "…") appears in str(exc). Rows marked as
sampling steps also check the request store is exactly as it was before the failed step. A row without a trigger,
or a trigger without a row, fails `test_every_row_has_a_trigger_and_every_trigger_a_row`: the doc cannot drift.

To add a case: write a row in docs/errors.md and a `@case("its_id")` function that raises it.
"""

from __future__ import annotations

import builtins
import json
import math
import re
import shutil
import textwrap
import types
from collections.abc import Callable
from functools import lru_cache
from pathlib import Path
from typing import Any

import attrs
import pytest
import torch

import samplechain
import samplechain.errors
from samplechain import Chain, PluginHost, RequestStore, Sampler, Stage, Stopping, hookimpl
from samplechain.engine.discovery import metadata

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "errors.md"
ELLIPSIS = "…"


# ------------------------------------------------------------------------------------------------ the doc's table
@attrs.frozen
class Row:
    id: str
    case: str
    input: str
    error: str
    message: str
    fix: str


def _cells(line: str) -> list[str]:
    """Split a Markdown table row on unescaped pipes; `\\|` is a literal pipe inside a cell."""
    parts = re.split(r"(?<!\\)\|", line.strip().strip("|"))
    return [p.strip().replace("\\|", "|") for p in parts]


def _unquote(cell: str) -> str:
    """A code span (`x` or `` x `` when the text has backticks) -> its text."""
    m = re.fullmatch(r"(`+)\s?(.*?)\s?\1", cell)
    return m.group(2) if m else cell


@lru_cache(maxsize=1)
def doc_rows() -> dict[str, Row]:
    lines = DOC.read_text(encoding="utf-8").splitlines()
    start = next(i for i, line in enumerate(lines) if _cells(line)[:2] == ["id", "case"])
    rows: dict[str, Row] = {}
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        cells = _cells(line)
        assert len(cells) == 6, f"docs/errors.md: row needs 6 cells, got {len(cells)}: {line}"
        row = Row(_unquote(cells[0]), cells[1], cells[2], _unquote(cells[3]), _unquote(cells[4]), cells[5])
        assert row.id not in rows, f"docs/errors.md: duplicate case id {row.id!r}"
        rows[row.id] = row
    return rows


def error_class(name: str) -> type[BaseException]:
    cls = getattr(samplechain.errors, name, None) or getattr(builtins, name, None)
    assert isinstance(cls, type) and issubclass(cls, BaseException), f"docs/errors.md: unknown error class {name!r}"
    return cls


# ------------------------------------------------------------------------------------------------ trigger registry
@attrs.define
class Trial:
    """What a trigger gets: a scratch folder, pytest's monkeypatch (undone after the case), and `step_chain()` for
    sampling cases (the stores it makes are checked after)."""

    tmp: Path
    monkeypatch: pytest.MonkeyPatch
    stores: list[tuple[RequestStore, str]] = attrs.field(factory=list)

    def step_chain(
        self,
        samplers: list[dict[str, Any]] | None = None,
        *,
        host: PluginHost | None = None,
        nonfinite: str = "error",
        **inputs: Any,
    ) -> tuple[Chain, RequestStore]:
        """A stateful chain (mirostat v2's mu, RNG positions) with requests "a" and "b" one accepted step in (given
        `inputs`, e.g. history=, to that step); the store's serialised state is recorded now and compared after the
        failure."""
        samplers = samplers or [{"use": "temperature", "t": 0.8}, {"use": "mirostat_v2", "tau": 3.0}]
        chain = Chain.load({"samplers": samplers, "nonfinite": nonfinite}, host=host)
        store = chain.new_store()
        store.add("a", {"seed": 1})
        store.add("b", {"seed": 2})
        chain.sample(torch.randn(2, VOCAB, generator=torch.Generator().manual_seed(0)), store, ["a", "b"], **inputs)
        self.stores.append((store, serialised(store)))
        return chain, store


Trigger = Callable[[Trial], None]
TRIGGERS: dict[str, Trigger] = {}
STEP_CASES: set[str] = set()
VOCAB = 16


def case(case_id: str, *, step: bool = False) -> Callable[[Trigger], Trigger]:
    """Register the trigger of docs/errors.md row `case_id`; step=True: a failed sampling step (store checked)."""

    def deco(fn: Trigger) -> Trigger:
        assert case_id not in TRIGGERS, case_id
        TRIGGERS[case_id] = fn
        if step:
            STEP_CASES.add(case_id)
        return fn

    return deco


def serialised(store: RequestStore) -> str:
    return json.dumps(store.snapshot(), sort_keys=True)


def logits(rows: int = 2) -> torch.Tensor:
    return torch.randn(rows, VOCAB, generator=torch.Generator().manual_seed(1))


# ------------------------------------------------------------------------------------------------ custom_generate
def _repo(tmp: Path, files: dict[str, str]) -> Path:
    root = tmp / "repo"
    (root / "custom_generate").mkdir(parents=True)
    for name, text in files.items():
        (root / "custom_generate" / name).write_text(textwrap.dedent(text), encoding="utf-8")
    return root


@case("repo_untrusted")
def _(t: Trial) -> None:
    from samplechain.integrations.hub import load_custom_generate

    load_custom_generate(_repo(t.tmp, {"generate.py": "def generate(model, **kw):\n    return None\n"}))


@case("repo_no_generate_py")
def _(t: Trial) -> None:
    from samplechain.integrations.hub import load_custom_generate

    load_custom_generate(_repo(t.tmp, {"chain.toml": 'samplers = [{ use = "greedy" }]\n'}), trust_remote_code=True)


@case("repo_syntax_error")
def _(t: Trial) -> None:
    from samplechain.integrations.hub import load_custom_generate

    load_custom_generate(
        _repo(t.tmp, {"generate.py": "def generate(model, **kw)\n    return None\n"}), trust_remote_code=True
    )


@case("repo_unsatisfiable_requirements")
def _(t: Trial) -> None:
    from samplechain.integrations.hub import load_custom_generate

    load_custom_generate(ROOT / "contrib" / "custom-generate-bad-requirements", trust_remote_code=True)


# ------------------------------------------------------------------------------------------------ samplechain convert
@case("convert_llama_cpp_unknown_flag")
def _(t: Trial) -> None:
    from samplechain.integrations.convert import import_chain

    import_chain("llama.cpp", ["--top-kk", "20"])


@case("convert_generation_config_not_json")
def _(t: Trial) -> None:
    from samplechain.integrations.convert import import_chain

    path = t.tmp / "generation_config.json"
    path.write_text('{"do_sample": true, "top_k": 5,,}')
    import_chain("transformers", path)


@case("convert_generation_config_wrong_type")
def _(t: Trial) -> None:
    from samplechain.integrations.convert import import_chain

    path = t.tmp / "generation_config.json"
    path.write_text('{"do_sample": true, "top_k": "many"}')
    import_chain("transformers", path)


@case("convert_vllm_unknown_key")
def _(t: Trial) -> None:
    from samplechain.integrations.convert import import_chain

    path = t.tmp / "params.json"
    path.write_text('{"temperature": 0.7, "top_pp": 0.9}')
    import_chain("vllm", path)


# ------------------------------------------------------------------------------------------------ chain config
def _load_toml(t: Trial, text: str) -> None:
    path = t.tmp / "chain.toml"
    path.write_text(textwrap.dedent(text), encoding="utf-8")
    Chain.load(path)


@case("config_malformed_toml")
def _(t: Trial) -> None:
    _load_toml(
        t,
        """\
        [chain]
        samplers = [ { use = "top_k", k = 40 }, { use = "dist" }
        """,
    )


@case("config_source_not_found")
def _(t: Trial) -> None:
    Chain.load("greedy")


@case("config_unknown_sampler")
def _(t: Trial) -> None:
    _load_toml(
        t,
        """\
        [chain]
        samplers = [ { use = "top_pp", p = 0.9 }, { use = "dist" } ]
        """,
    )


@case("config_param_out_of_range")
def _(t: Trial) -> None:
    _load_toml(
        t,
        """\
        [chain]
        samplers = [ { use = "top_k", k = 40 }, { use = "top_p", p = 1.5 }, { use = "dist" } ]
        """,
    )


@case("config_unknown_param")
def _(t: Trial) -> None:
    _load_toml(
        t,
        """\
        [chain]
        samplers = [ { use = "top_k", kk = 40 }, { use = "dist" } ]
        """,
    )


@case("config_wrong_type")
def _(t: Trial) -> None:
    _load_toml(
        t,
        """\
        [chain]
        samplers = [ { use = "top_k", k = "40" }, { use = "dist" } ]
        """,
    )


@case("config_unknown_chain_key")
def _(t: Trial) -> None:
    _load_toml(
        t,
        """\
        [chain]
        sampler = [ { use = "dist" } ]
        """,
    )


@case("config_unknown_drafter")
def _(t: Trial) -> None:
    _load_toml(
        t,
        """\
        [chain]
        samplers = [ { use = "greedy" } ]

        [draft]
        use = "prompt_lookpu"
        """,
    )


@case("config_draft_param_out_of_range")
def _(t: Trial) -> None:
    _load_toml(
        t,
        """\
        [chain]
        samplers = [ { use = "greedy" } ]

        [draft]
        use = "prompt_lookup"
        num_tokens = 0
        """,
    )


@case("config_no_selector")
def _(t: Trial) -> None:
    _load_toml(
        t,
        """\
        [chain]
        samplers = [ { use = "top_k", k = 40 }, { use = "temperature", t = 0.7 } ]
        """,
    )


@case("config_bad_nonfinite_policy")
def _(t: Trial) -> None:
    _load_toml(
        t,
        """\
        [chain]
        nonfinite = "clip"
        samplers = [ { use = "top_k", k = 40 }, { use = "dist" } ]
        """,
    )


def _param_ranges() -> types.ModuleType:
    """tests/test_param_ranges.py, whose cases come from the samplers' schemas (tests are not importable by name
    under --import-mode=importlib)."""
    import importlib.util

    path = Path(__file__).with_name("test_param_ranges.py")
    spec = importlib.util.spec_from_file_location("param_ranges_cases", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


@case("param_out_of_range_every_sampler")
def _(t: Trial) -> None:
    ranges = _param_ranges()
    first = ranges.CASES[0]  # tests/test_param_ranges.py checks every one of them, in a config and per request
    Chain.load(ranges.chain_config(first, **{first.field: first.value}))


@case("config_unknown_preset")
def _(t: Trial) -> None:
    Chain.load("preset:llamacpp")


@case("config_unknown_backend")
def _(t: Trial) -> None:
    Chain.load({"samplers": [{"use": "greedy"}], "backend": "tpu"})


# ------------------------------------------------------------------------------------------------ plugins
BROKEN = ROOT / "contrib" / "samplechain-broken-example"


def _broken_plugin_host(t: Trial, *, strict: bool) -> PluginHost:
    """contrib/samplechain-broken-example installed into a scratch site folder (a real dist-info, as pip makes);
    its module imports a package nobody installed."""
    site = t.tmp / "site"
    site.mkdir()
    shutil.copy(BROKEN / "samplechain_broken_example.py", site / "samplechain_broken_example.py")
    info = site / "samplechain_broken_example-0.1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: samplechain-broken-example\nVersion: 0.1.0\n")
    (info / "entry_points.txt").write_text("[samplechain]\nbroken_example = samplechain_broken_example\n")
    t.monkeypatch.syspath_prepend(str(site))
    fake = [ep for d in metadata.distributions(path=[str(site)]) for ep in d.entry_points]
    greedy = [ep for ep in metadata.entry_points(group="samplechain") if ep.name == "greedy"]
    return PluginHost(entry_points=greedy + fake, strict=strict, use_env=False)


@case("plugin_import_fails_strict")
def _(t: Trial) -> None:
    host = _broken_plugin_host(t, strict=True)
    Chain.load({"samplers": [{"use": "broken_example"}, {"use": "greedy"}]}, host=host)


@case("plugin_import_fails")
def _(t: Trial) -> None:
    host = _broken_plugin_host(t, strict=False)
    with pytest.warns(samplechain.PluginWarning, match="broken_example"):
        Chain.load({"samplers": [{"use": "broken_example"}, {"use": "greedy"}]}, host=host)


class Exploding(Sampler):
    """A third-party transform with a bug that shows from a request's second token on."""

    name = "exploding"
    stage = Stage.TRANSFORM

    def apply(self, cand, ctx):
        if bool((ctx.positions > 0).any()):
            raise RuntimeError("index 99 is out of bounds for dimension 1 with size 16")
        return cand


@hookimpl
def _register_exploding(register):
    register(Exploding)


def _two_steps_with_plugin(t: Trial, module: str, register: Any, sampler: str) -> None:
    """A strict host with one in-process plugin `module` registering `sampler`; temperature -> it -> mirostat_v2,
    and a step of requests a and b (whose second token is where the plugin breaks)."""
    host = PluginHost(strict=True, use_env=False)
    plugin = types.ModuleType(module)
    plugin.register_samplers = register  # type: ignore[attr-defined]
    host.register_plugin(plugin, name=module.replace("_", "-"))
    samplers = [{"use": "temperature", "t": 0.8}, {"use": sampler}, {"use": "mirostat_v2"}]
    chain, store = t.step_chain(samplers, host=host)
    chain.sample(logits(), store, ["a", "b"])


@case("plugin_raises_mid_chain", step=True)
def _(t: Trial) -> None:
    _two_steps_with_plugin(t, "acme_exploding", _register_exploding, "exploding")


class FragileState(Sampler):
    """A third-party stateful transform whose state update breaks from a request's second token on."""

    name = "fragile_state"
    stage = Stage.TRANSFORM

    def is_stateful(self) -> bool:
        return True

    def state_spec(self):
        return {"seen": (torch.int64, (), 0)}

    def apply(self, cand, ctx):
        return cand

    def accept(self, ctx, token_ids):
        if bool((ctx.positions > 0).any()):
            raise ValueError("state column 'seen' got shape (3,) for a batch of 2")
        return {"seen": ctx.state["seen"] + 1}


@hookimpl
def _register_fragile(register):
    register(FragileState)


@case("plugin_raises_in_accept", step=True)
def _(t: Trial) -> None:
    _two_steps_with_plugin(t, "acme_fragile", _register_fragile, "fragile_state")


# ------------------------------------------------------------------------------------------------ sampling steps
@case("sampling_nan_logits", step=True)
def _(t: Trial) -> None:
    chain, store = t.step_chain()
    x = logits()
    x[1, 3] = float("nan")
    chain.sample(x, store, ["a", "b"])


@case("sampling_posinf_logits", step=True)
def _(t: Trial) -> None:
    chain, store = t.step_chain()
    x = logits()
    x[0, 5] = x[0, 9] = float("inf")
    chain.sample(x, store, ["a", "b"])


@case("sampling_chain_overflow", step=True)
def _(t: Trial) -> None:
    chain, store = t.step_chain()
    x = logits()
    x[0, 2] = 3e38  # finite in float32; temperature 0.8 divides it past the largest float32
    chain.sample(x, store, ["a", "b"])


CFG = [{"use": "cfg", "scale": 1.5}, {"use": "mirostat_v2", "tau": 3.0}]


@case("sampling_unconditional_logits_nan", step=True)
def _(t: Trial) -> None:
    chain, store = t.step_chain(CFG, unconditional_logits=torch.zeros(2, VOCAB))
    uncond = torch.zeros(2, VOCAB)
    uncond[0, 0] = float("nan")
    chain.sample(logits(), store, ["a", "b"], unconditional_logits=uncond)


@case("sampling_sanitize_row_all_masked", step=True)
def _(t: Trial) -> None:
    chain, store = t.step_chain(nonfinite="sanitize")
    x = logits()
    x[0] = float("-inf")
    x[1, 3] = float("nan")  # sanitised to 0: row b alone would sample
    chain.sample(x, store, ["a", "b"])


@case("sampling_row_all_masked", step=True)
def _(t: Trial) -> None:
    chain, store = t.step_chain()
    x = logits()
    x[0] = float("-inf")
    chain.sample(x, store, ["a", "b"])


@case("sampling_row_emptied_by_sampler", step=True)
def _(t: Trial) -> None:
    chain, store = t.step_chain(
        [{"use": "top_k", "k": 1}, {"use": "suppress_tokens", "ids": [2]}, {"use": "dist"}]
    )  # the set-up step's rows peak at 13 and 7
    x = logits()
    x[0, 2] = 50.0  # row a's only survivor of top_k is the suppressed token
    chain.sample(x, store, ["a", "b"])


@case("sampling_logits_1d", step=True)
def _(t: Trial) -> None:
    chain, store = t.step_chain()
    chain.sample(logits()[0], store, ["a"])


@case("sampling_logits_3d", step=True)
def _(t: Trial) -> None:
    chain, store = t.step_chain()
    chain.sample(logits()[:, None, :], store, ["a", "b"])


@case("sampling_logits_not_tensor", step=True)
def _(t: Trial) -> None:
    chain, store = t.step_chain()
    chain.sample(logits().numpy(), store, ["a", "b"])


@case("sampling_logits_int_dtype", step=True)
def _(t: Trial) -> None:
    chain, store = t.step_chain()
    chain.sample(logits().to(torch.int64), store, ["a", "b"])


@case("sampling_logits_bool_dtype", step=True)
def _(t: Trial) -> None:
    chain, store = t.step_chain()
    chain.sample(logits() > 0, store, ["a", "b"])


@case("sampling_logits_empty_vocab", step=True)
def _(t: Trial) -> None:
    chain, store = t.step_chain()
    chain.sample(torch.zeros(2, 0), store, ["a", "b"])


@case("sampling_logits_meta_device", step=True)
def _(t: Trial) -> None:
    chain, store = t.step_chain()
    chain.sample(torch.empty(2, VOCAB, device="meta"), store, ["a", "b"])


@case("sampling_store_on_other_device", step=True)
def _(t: Trial) -> None:
    chain, _store = t.step_chain()
    elsewhere = chain.new_store(device="meta")  # the one non-cpu device every torch build has
    elsewhere.add_many(["a", "b"])
    chain.sample(logits(), elsewhere, ["a", "b"])


@case("sampling_store_of_other_chain", step=True)
def _(t: Trial) -> None:
    _chain, store = t.step_chain()
    Chain.load({"samplers": [{"use": "temperature", "t": 0.8}, {"use": "mirostat_v2", "tau": 3.0}]}).sample(
        logits(), store, ["a", "b"]
    )


@case("sampling_store_without_request_ids", step=True)
def _(t: Trial) -> None:
    chain, store = t.step_chain()
    chain.sample(logits(), store)


@case("sampling_duplicate_request_in_batch", step=True)
def _(t: Trial) -> None:
    chain, store = t.step_chain()
    chain.sample(logits(), store, ["a", "a"])


PENALTIES = [{"use": "penalties", "repeat": 1.3}, {"use": "mirostat_v2", "tau": 3.0}]


def _history(rows: int = 2, dtype: torch.dtype = torch.int64) -> torch.Tensor:
    return torch.tensor([[-1, 1, 2, 3], [4, 5, 6, 7], [7, 8, 9, 10]], dtype=dtype)[:rows]


@case("sampling_history_missing", step=True)
def _(t: Trial) -> None:
    chain, store = t.step_chain(PENALTIES, history=_history())
    chain.sample(logits(), store, ["a", "b"])


@case("sampling_history_batch_mismatch", step=True)
def _(t: Trial) -> None:
    chain, store = t.step_chain(PENALTIES, history=_history())
    chain.sample(logits(), store, ["a", "b"], history=_history(3))


@case("sampling_history_wrong_dtype", step=True)
def _(t: Trial) -> None:
    chain, store = t.step_chain(PENALTIES, history=_history())
    chain.sample(logits(), store, ["a", "b"], history=_history(dtype=torch.float32))


@case("sampling_prompt_lengths_mismatch", step=True)
def _(t: Trial) -> None:
    chain, store = t.step_chain(PENALTIES, history=_history())
    chain.sample(logits(), store, ["a", "b"], history=_history(), prompt_lengths=torch.tensor([3, 4, 4]))


@case("sampling_unconditional_missing", step=True)
def _(t: Trial) -> None:
    chain, store = t.step_chain(CFG, unconditional_logits=torch.zeros(2, VOCAB))
    chain.sample(logits(), store, ["a", "b"])


@case("sampling_unconditional_shape_mismatch", step=True)
def _(t: Trial) -> None:
    chain, store = t.step_chain(CFG, unconditional_logits=torch.zeros(2, VOCAB))
    chain.sample(logits(), store, ["a", "b"], unconditional_logits=torch.zeros(3, VOCAB))


@case("sampling_batch_size_mismatch", step=True)
def _(t: Trial) -> None:
    chain, store = t.step_chain()
    chain.sample(logits(3), store, ["a", "b"])


@case("sampling_unknown_request", step=True)
def _(t: Trial) -> None:
    chain, store = t.step_chain()
    chain.sample(logits(), store, ["a", "c"])


@case("request_param_out_of_range")
def _(t: Trial) -> None:
    chain = Chain.load({"samplers": [{"use": "top_p", "p": 0.9}, {"use": "dist"}]})
    chain.new_store().add("r1", {"top_p": 1.5})


@case("request_unknown_param")
def _(t: Trial) -> None:
    chain = Chain.load({"samplers": [{"use": "top_p", "p": 0.9}, {"use": "dist"}]})
    chain.new_store().add("r1", {"top_pp": 0.5})


# ------------------------------------------------------------------------------------------------ generation, stopping
@lru_cache(maxsize=1)
def embedded_model() -> tuple[Any, Any]:
    """The shipped docs-gpt2 and its tokenizer, loaded once for the generation rows."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from samplechain.models import tiny_model_path

    path = tiny_model_path()
    return AutoModelForCausalLM.from_pretrained(path), AutoTokenizer.from_pretrained(path)


def _generate(**kwargs: Any) -> None:
    from samplechain.generation import generate

    model, tokenizer = embedded_model()
    generate(model, tokenizer, "Hello", chain="preset:llama.cpp", **kwargs)


@case("generate_max_new_tokens_zero")
def _(t: Trial) -> None:
    _generate(max_new_tokens=0)


@case("generate_empty_stop_string")
def _(t: Trial) -> None:
    _generate(max_new_tokens=4, stop_strings=["\n\n", ""])


@case("generate_unknown_keyword")
def _(t: Trial) -> None:
    _generate(max_new_tokens=4, temprature=0.7)


@case("generate_settings_with_chain")
def _(t: Trial) -> None:
    _generate(max_new_tokens=4, temperature=0.7, do_sample=True)  # _generate gives chain=


@case("generate_batch_invariant_half")
def _(t: Trial) -> None:
    import copy

    from samplechain.generation import generate
    from samplechain.generation.model import TransformersRunner

    model, tokenizer = embedded_model()
    half = copy.deepcopy(model).to(torch.bfloat16)
    TransformersRunner.batch_invariant = True
    try:
        generate(half, tokenizer, "Hello", chain="preset:llama.cpp", max_new_tokens=4)
    finally:
        TransformersRunner.batch_invariant = False


@case("generate_unmapped_setting")
def _(t: Trial) -> None:
    _generate(max_new_tokens=4, diversity_penalty=0.5)


@case("generate_bad_request_param")
def _(t: Trial) -> None:
    _generate(max_new_tokens=4, params={"temperature": -1.0})


@case("generate_bad_seed")
def _(t: Trial) -> None:
    _generate(max_new_tokens=4, seed=[1, 2])


@case("generate_bad_argument")
def _(t: Trial) -> None:
    _generate(max_new_tokens=4, ignore_eos="no")


@case("resume_damaged_checkpoint")
def _(t: Trial) -> None:
    from samplechain.generation import Generation, generate

    model, tokenizer = embedded_model()
    gen = Generation(model, tokenizer, "Hello", chain="preset:llama.cpp", seed=1, max_new_tokens=4)
    steps = gen.steps()
    next(steps), next(steps)
    checkpoint = gen.checkpoint()
    checkpoint["generated"][0] = checkpoint["generated"][0][:1]
    generate(model, tokenizer, resume=checkpoint, chain="preset:llama.cpp", max_new_tokens=4)


@case("stop_no_length_limit")
def _(t: Trial) -> None:
    Stopping([Stopping.criterion("eos")])


@case("stop_wrong_answer_shape")
def _(t: Trial) -> None:
    stopping = Stopping([Stopping.criterion("max_new_tokens", {"n": 4}), lambda ctx: torch.ones(3, dtype=torch.bool)])
    setup = samplechain.StopSetup(2, 4, torch.tensor([4, 4]), torch.device("cpu"))
    ctx = samplechain.StopContext(torch.zeros(2, 5, dtype=torch.int64), 1, torch.zeros(2, dtype=torch.int64), setup)
    stopping.check(ctx)


# ------------------------------------------------------------------------------------------------ the tests
@pytest.mark.parametrize("case_id", list(doc_rows()))
def test_documented_error(case_id: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    row = doc_rows()[case_id]
    trigger = TRIGGERS.get(case_id)
    assert trigger is not None, f"docs/errors.md row {case_id!r} has no @case trigger in {__file__}"
    trial = Trial(tmp_path, monkeypatch)
    with pytest.raises(BaseException) as caught:
        trigger(trial)
    exc = caught.value
    assert type(exc) is error_class(row.error), f"{case_id}: raised {type(exc).__name__}: {exc}"
    text = str(exc)
    for fragment in row.message.split(ELLIPSIS):
        assert fragment.strip() in text, f"{case_id}: {fragment.strip()!r} not in the message:\n{text}"
    if case_id in STEP_CASES:
        assert trial.stores, f"{case_id}: a sampling case must build its store with trial.step_chain()"
        for store, before in trial.stores:
            assert serialised(store) == before, f"{case_id}: the failed step changed the request store"


def test_every_row_has_a_trigger_and_every_trigger_a_row() -> None:
    rows, triggers = set(doc_rows()), set(TRIGGERS)
    assert not rows - triggers, f"rows of docs/errors.md without a trigger: {sorted(rows - triggers)}"
    assert not triggers - rows, f"triggers without a row in docs/errors.md: {sorted(triggers - rows)}"


def test_sampling_rows_are_the_step_cases() -> None:
    """A row whose case is a failed sampling step is checked for an unchanged store (its id starts sampling_)."""
    assert {i for i in doc_rows() if i.startswith("sampling_")} <= STEP_CASES


# ------------------------------------------------------------------------------------------------ the nonfinite policy
# docs/errors.md "NaN and infinite logits": "error" (the default) and "sanitize", whose oracle is transformers'
# InfNanRemoveLogitsProcessor (the same distribution after a softmax; -inf stays masked).
def _broken_logits() -> torch.Tensor:
    """Row 0 NaN at two tokens, row 1 +inf at two tokens, row 2 NaN, +inf and -inf, row 3 finite with -inf."""
    x = torch.randn(4, VOCAB, generator=torch.Generator().manual_seed(3)) * 3
    x[0, [2, 7]] = float("nan")
    x[1, [4, 11]] = float("inf")
    x[2, 1], x[2, 6], x[2, 9] = float("nan"), float("inf"), float("-inf")
    x[3, :5] = float("-inf")
    return x


def _seeded(chain: Chain, rows: int) -> tuple[RequestStore, list[str]]:
    store, ids = chain.new_store(), [f"r{i}" for i in range(rows)]
    for i, rid in enumerate(ids):
        store.add(rid, {"seed": 100 + i})
    return store, ids


def test_the_nonfinite_policy_defaults_to_error():
    chain = Chain.load({"samplers": [{"use": "dist"}]})
    assert chain.config.nonfinite == "error"
    with pytest.raises(samplechain.SamplingError, match=r"NaN or \+inf for request\(s\) \['row0', 'row1', 'row2'\]"):
        chain.sample(_broken_logits())


FILTERS = [
    {"use": "top_k", "k": 3},
    {"use": "top_p", "p": 0.9},
    {"use": "min_p", "p": 0.1},
    {"use": "typical", "p": 0.9},
    {"use": "top_n_sigma", "n": 1.0},
]


@pytest.mark.parametrize("first", FILTERS, ids=lambda f: f["use"])
def test_error_names_nan_and_inf_rows_whatever_the_filters_made_of_them(first: dict[str, Any]):
    """A filter may turn a NaN row into an all-masked one; the error still blames the logits, with the token."""
    x = torch.randn(3, VOCAB, generator=torch.Generator().manual_seed(7))
    x[0, 3], x[1, 5], x[2] = float("nan"), float("inf"), float("-inf")
    with pytest.raises(samplechain.SamplingError) as caught:
        Chain.load({"samplers": [first, {"use": "dist"}]}).sample(x)
    text = str(caught.value)
    assert (
        "logits contain NaN or +inf for request(s) ['row0', 'row1'] ('row0': NaN at token 3; 'row1': +inf at "
        "token 5)" in text
    ), text
    assert "every token is masked (-inf) for request(s) ['row2']" in text, text


@pytest.mark.parametrize("first", FILTERS, ids=lambda f: f["use"])
def test_sanitize_runs_through_every_filter(first: dict[str, Any]):
    x = torch.randn(2, VOCAB, generator=torch.Generator().manual_seed(8))
    x[0, 3], x[1, 5] = float("nan"), float("inf")
    out = Chain.load({"samplers": [first, {"use": "dist"}], "nonfinite": "sanitize"}).sample(x)
    assert out.token_ids[1] == 5 and torch.isfinite(out.logprobs).all()


def test_sanitize_gives_the_distribution_of_transformers_inf_nan_remove():
    from transformers.generation.logits_process import InfNanRemoveLogitsProcessor

    x = _broken_logits()
    ours = Chain.load({"samplers": [{"use": "greedy"}], "nonfinite": "sanitize"}).process(x)
    theirs = InfNanRemoveLogitsProcessor()(torch.zeros(4, 1, dtype=torch.int64), x.clone())
    torch.testing.assert_close(ours.softmax(-1), theirs.softmax(-1))


def test_sanitize_maps_nan_to_zero_and_keeps_only_the_inf_tokens_of_a_row():
    x = _broken_logits()
    ours = Chain.load({"samplers": [{"use": "greedy"}], "nonfinite": "sanitize"}).process(x)
    assert ours[0, 2] == ours[0, 7] == 0.0 and torch.isfinite(ours[0]).all()
    inf_row = torch.full((VOCAB,), float("-inf"))
    inf_row[[4, 11]] = 0.0
    assert torch.equal(ours[1], inf_row)
    assert ours[2, 6] == 0.0 and torch.isinf(ours[2]).sum() == VOCAB - 1  # +inf wins over the NaN made 0
    assert torch.equal(ours[3], x[3])  # -inf stays masked, finite rows are untouched


def test_sanitize_draws_the_tokens_the_clean_logits_draw():
    """NaN -> 0 is exactly the chain on torch.nan_to_num(nan=0) (same seeds, same tokens, same logprobs)."""
    samplers = [{"use": "top_k", "k": 8}, {"use": "temperature", "t": 0.7}, {"use": "dist"}]
    x = torch.randn(3, VOCAB, generator=torch.Generator().manual_seed(4))
    x[0, 3] = x[2, [0, 5]] = float("nan")
    sanitize = Chain.load({"samplers": samplers, "nonfinite": "sanitize"})
    clean = Chain.load({"samplers": samplers})
    got = sanitize.sample(x, *_seeded(sanitize, 3))
    want = clean.sample(torch.nan_to_num(x, nan=0.0), *_seeded(clean, 3))
    assert torch.equal(got.token_ids, want.token_ids)
    torch.testing.assert_close(got.logprobs, want.logprobs)


def test_sanitize_inf_survives_a_later_temperature_and_picks_only_inf_tokens():
    """transformers' finfo.max divided by a temperature below 1 overflows back to +inf; 0 cannot."""
    chain = Chain.load({"samplers": [{"use": "temperature", "t": 0.25}, {"use": "dist"}], "nonfinite": "sanitize"})
    x = torch.randn(64, VOCAB, generator=torch.Generator().manual_seed(5))
    x[:, [3, 12]] = float("inf")
    out = chain.sample(x)
    assert set(out.token_ids.tolist()) == {3, 12}
    torch.testing.assert_close(out.logprobs, torch.full((64,), -math.log(2)))


def test_sanitize_never_writes_the_callers_logits_and_advances_the_store():
    chain = Chain.load({"samplers": [{"use": "mirostat_v2", "tau": 3.0}], "nonfinite": "sanitize"})
    store, ids = _seeded(chain, 4)
    x = _broken_logits()
    kept = x.clone()
    chain.sample(x, store, ids)
    torch.testing.assert_close(x, kept, equal_nan=True)
    assert [row["position"] for row in store.snapshot().values()] == [1, 1, 1, 1]


def test_sanitize_cleans_the_unconditional_logits_too():
    samplers = [{"use": "cfg", "scale": 1.5}, {"use": "greedy"}]
    uncond = torch.zeros(2, VOCAB)
    uncond[0, 3] = float("nan")
    x = logits()
    out = Chain.load({"samplers": samplers, "nonfinite": "sanitize"}).sample(x, unconditional_logits=uncond)
    want = Chain.load({"samplers": samplers}).sample(x, unconditional_logits=torch.zeros(2, VOCAB))
    assert torch.equal(out.token_ids, want.token_ids)


# ------------------------------------------------------------------------------------------------ accepted inputs
# docs/errors.md "Inputs that are accepted, not errors": each gives the tokens the plain input gives.
ACCEPTING = [
    {"use": "penalties", "repeat": 1.3},
    {"use": "top_k", "k": 6},
    {"use": "temperature", "t": 0.8},
    {"use": "dist"},
]


def _draw(x: torch.Tensor, **inputs: Any) -> samplechain.SampleOutput:
    chain = Chain.load({"samplers": ACCEPTING})
    inputs.setdefault("history", torch.tensor([[-1, 1, 2], [3, 3, 4], [5, 0, 9]]))
    return chain.sample(x, *_seeded(chain, 3), **inputs)


def _plain() -> torch.Tensor:
    return torch.randn(3, VOCAB, generator=torch.Generator().manual_seed(6))


@pytest.mark.parametrize("variant", ["transposed", "strided", "float16", "bfloat16", "float64", "requires_grad"])
def test_accepted_logits_give_the_tokens_of_plain_float32_logits(variant: str):
    x = _plain()
    if variant in ("float16", "bfloat16"):
        x = x.to(getattr(torch, variant)).float()  # the values the low-precision tensor holds
    given = {
        "transposed": lambda: x.t().contiguous().t(),
        "strided": lambda: torch.stack([x, x], dim=2)[:, :, 0],
        "float16": lambda: x.half(),
        "bfloat16": lambda: x.bfloat16(),
        "float64": lambda: x.double(),
        "requires_grad": lambda: x.clone().requires_grad_(),
    }[variant]()
    assert variant not in ("transposed", "strided") or not given.is_contiguous()
    got, want = _draw(given), _draw(x)
    assert torch.equal(got.token_ids, want.token_ids)
    torch.testing.assert_close(got.logprobs, want.logprobs)


def test_int32_history_and_list_prompt_lengths_are_accepted():
    x = _plain()
    history = torch.tensor([[-1, 1, 2], [3, 3, 4], [5, 0, 9]])
    want = _draw(x, history=history, prompt_lengths=torch.tensor([2, 3, 3]))
    got = _draw(x, history=history.to(torch.int32), prompt_lengths=[2, 3, 3])
    assert torch.equal(got.token_ids, want.token_ids)
