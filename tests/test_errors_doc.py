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
from samplechain.plugins import metadata

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
    for line in lines[start + 2:]:
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

    def step_chain(self, samplers: list[dict[str, Any]] | None = None, *, host: PluginHost | None = None
                   ) -> tuple[Chain, RequestStore]:
        """A stateful chain (mirostat v2's mu, RNG positions) with requests "a" and "b" one accepted step in; the
        store's serialised state is recorded now and compared after the failure."""
        samplers = samplers or [{"use": "temperature", "t": 0.8}, {"use": "mirostat_v2", "tau": 3.0}]
        chain = Chain.load({"samplers": samplers}, host=host)
        store = chain.new_store()
        store.add("a", {"seed": 1})
        store.add("b", {"seed": 2})
        chain.sample(torch.randn(2, VOCAB, generator=torch.Generator().manual_seed(0)), store, ["a", "b"])
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
    from samplechain.hub import load_custom_generate

    load_custom_generate(_repo(t.tmp, {"generate.py": "def generate(model, **kw):\n    return None\n"}))


@case("repo_no_generate_py")
def _(t: Trial) -> None:
    from samplechain.hub import load_custom_generate

    load_custom_generate(_repo(t.tmp, {"chain.toml": "samplers = [{ use = \"greedy\" }]\n"}), trust_remote_code=True)


@case("repo_syntax_error")
def _(t: Trial) -> None:
    from samplechain.hub import load_custom_generate

    load_custom_generate(_repo(t.tmp, {"generate.py": "def generate(model, **kw)\n    return None\n"}),
                         trust_remote_code=True)


@case("repo_unsatisfiable_requirements")
def _(t: Trial) -> None:
    from samplechain.hub import load_custom_generate

    load_custom_generate(ROOT / "contrib" / "custom-generate-bad-requirements", trust_remote_code=True)


# ------------------------------------------------------------------------------------------------ samplechain convert
@case("convert_llama_cpp_unknown_flag")
def _(t: Trial) -> None:
    from samplechain.convert import import_chain

    import_chain("llama.cpp", ["--top-kk", "20"])


@case("convert_generation_config_not_json")
def _(t: Trial) -> None:
    from samplechain.convert import import_chain

    path = t.tmp / "generation_config.json"
    path.write_text('{"do_sample": true, "top_k": 5,,}')
    import_chain("transformers", path)


@case("convert_generation_config_wrong_type")
def _(t: Trial) -> None:
    from samplechain.convert import import_chain

    path = t.tmp / "generation_config.json"
    path.write_text('{"do_sample": true, "top_k": "many"}')
    import_chain("transformers", path)


@case("convert_vllm_unknown_key")
def _(t: Trial) -> None:
    from samplechain.convert import import_chain

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
    _load_toml(t, """\
        [chain]
        samplers = [ { use = "top_k", k = 40 }, { use = "dist" }
        """)


@case("config_unknown_sampler")
def _(t: Trial) -> None:
    _load_toml(t, """\
        [chain]
        samplers = [ { use = "top_pp", p = 0.9 }, { use = "dist" } ]
        """)


@case("config_param_out_of_range")
def _(t: Trial) -> None:
    _load_toml(t, """\
        [chain]
        samplers = [ { use = "top_k", k = 40 }, { use = "top_p", p = 1.5 }, { use = "dist" } ]
        """)


@case("config_unknown_param")
def _(t: Trial) -> None:
    _load_toml(t, """\
        [chain]
        samplers = [ { use = "top_k", kk = 40 }, { use = "dist" } ]
        """)


@case("config_wrong_type")
def _(t: Trial) -> None:
    _load_toml(t, """\
        [chain]
        samplers = [ { use = "top_k", k = "40" }, { use = "dist" } ]
        """)


@case("config_unknown_chain_key")
def _(t: Trial) -> None:
    _load_toml(t, """\
        [chain]
        sampler = [ { use = "dist" } ]
        """)


@case("config_no_selector")
def _(t: Trial) -> None:
    _load_toml(t, """\
        [chain]
        samplers = [ { use = "top_k", k = 40 }, { use = "temperature", t = 0.7 } ]
        """)


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


@case("plugin_raises_mid_chain", step=True)
def _(t: Trial) -> None:
    host = PluginHost(strict=True, use_env=False)
    plugin = types.ModuleType("acme_exploding")
    plugin.register_samplers = _register_exploding  # type: ignore[attr-defined]
    host.register_plugin(plugin, name="acme-exploding")
    samplers = [{"use": "temperature", "t": 0.8}, {"use": "exploding"}, {"use": "mirostat_v2"}]
    chain, store = t.step_chain(samplers, host=host)
    chain.sample(logits(), store, ["a", "b"])


# ------------------------------------------------------------------------------------------------ sampling steps
@case("sampling_nan_logits", step=True)
def _(t: Trial) -> None:
    chain, store = t.step_chain()
    x = logits()
    x[1, 3] = float("nan")
    chain.sample(x, store, ["a", "b"])


@case("sampling_row_all_masked", step=True)
def _(t: Trial) -> None:
    chain, store = t.step_chain()
    x = logits()
    x[0] = float("-inf")
    chain.sample(x, store, ["a", "b"])


@case("sampling_logits_1d", step=True)
def _(t: Trial) -> None:
    chain, store = t.step_chain()
    chain.sample(logits()[0], store, ["a"])


@case("sampling_logits_int_dtype", step=True)
def _(t: Trial) -> None:
    chain, store = t.step_chain()
    chain.sample(logits().to(torch.int64), store, ["a", "b"])


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

    from samplechain.models import default_model_path

    path = default_model_path()
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


@case("generate_bad_request_param")
def _(t: Trial) -> None:
    _generate(max_new_tokens=4, params={"temperature": -1.0})


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
