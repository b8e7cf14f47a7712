"""Write the generated documentation: docs/samplers/README.md (the sampler catalogue), docs/reference.md (the
chain-config reference) and docs/presets.md (the preset chains), all from the installed plugins' own attrs schemas,
the core's config loader and registry.toml, so they cannot drift from the code. tests/test_docs.py checks they are
current.

    python scripts/sampler_catalogue.py            # rewrite the three files
    python scripts/sampler_catalogue.py --check    # exit 1 if any of them is out of date
"""

from __future__ import annotations

import argparse
import inspect
import io
import json
import math
import os
import re
import sys
import tokenize
import typing
from collections.abc import Callable, Mapping
from functools import lru_cache
from pathlib import Path
from typing import Any

import attrs

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
OUT = DOCS / "samplers" / "README.md"
REFERENCE = DOCS / "reference.md"
PRESETS = DOCS / "presets.md"

# the reference implementation(s) each sampler reproduces
REFERENCES = {
    "adaptive_p": "llama.cpp `llama_sampler_init_adaptive_p`",
    "allowed_tokens": "vLLM `allowed_token_ids`",
    "bad_words": "transformers `NoBadWordsLogitsProcessor`; vLLM `bad_words`",
    "begin_suppress_tokens": "transformers `SuppressTokensAtBeginLogitsProcessor`",
    "cfg": "transformers `UnbatchedClassifierFreeGuidanceLogitsProcessor`",
    "dist": "llama.cpp `llama_sampler_init_dist`; transformers softmax + multinomial",
    "dry": "llama.cpp `llama_sampler_init_dry`; text-generation-webui DRY",
    "epsilon": "transformers `EpsilonLogitsWarper`",
    "eta": "transformers `EtaLogitsWarper`",
    "forced_bos": "transformers `ForcedBOSTokenLogitsProcessor`",
    "forced_eos": "transformers `ForcedEOSTokenLogitsProcessor`",
    "grammar": "llama.cpp `llama_sampler_init_grammar(_lazy)` via llguidance",
    "greedy": "llama.cpp `llama_sampler_init_greedy`; transformers `do_sample=False`",
    "inf_nan_remove": "transformers `InfNanRemoveLogitsProcessor`",
    "infill": "llama.cpp `llama_sampler_init_infill`",
    "length_decay": "transformers `ExponentialDecayLengthPenalty`",
    "logit_bias": "llama.cpp `llama_sampler_init_logit_bias`; vLLM / OpenAI `logit_bias`",
    "min_new_tokens": "transformers `MinNewTokensLengthLogitsProcessor`; vLLM `min_tokens`",
    "min_p": "llama.cpp `llama_sampler_init_min_p`; transformers `MinPLogitsWarper`",
    "mirostat": "llama.cpp `llama_sampler_init_mirostat`",
    "mirostat_v2": "llama.cpp `llama_sampler_init_mirostat_v2`",
    "no_repeat_ngram": "transformers `NoRepeatNGramLogitsProcessor`",
    "p_less": "llama.cpp p-less sampling (PR #26035); the p-less paper",
    "penalties": "llama.cpp `llama_sampler_init_penalties`; transformers `RepetitionPenaltyLogitsProcessor`; vLLM",
    "quadratic": "text-generation-webui `QuadraticSamplingLogitsWarper`",
    "reasoning_budget": "llama.cpp `common_reasoning_budget_init` (`--reasoning-budget`); vLLM `thinking_token_budget`",
    "renormalize": "transformers `LogitNormalization`",
    "sequence_bias": "transformers `SequenceBiasLogitsProcessor`",
    "suppress_tokens": "transformers `SuppressTokensLogitsProcessor`",
    "temp_ext": "llama.cpp `llama_sampler_init_temp_ext`; text-generation-webui dynamic temperature",
    "temperature": "llama.cpp `llama_sampler_init_temp`; transformers `TemperatureLogitsWarper`",
    "tfs": "llama.cpp `llama_sampler_init_tail_free` (removed upstream); text-generation-webui `TailFreeLogitsWarper`",
    "top_a": "text-generation-webui `TopALogitsWarper`",
    "top_h": "transformers `TopHLogitsWarper`",
    "top_k": "llama.cpp `llama_sampler_init_top_k`; transformers `TopKLogitsWarper`",
    "top_n_sigma": "llama.cpp `llama_sampler_init_top_n_sigma`",
    "top_p": "llama.cpp `llama_sampler_init_top_p`; transformers `TopPLogitsWarper`",
    "typical": "llama.cpp `llama_sampler_init_typical`; transformers `TypicalLogitsWarper`",
    "watermark": "transformers `WatermarkLogitsProcessor` / `WatermarkDetector`",
    "xtc": "llama.cpp `llama_sampler_init_xtc`; text-generation-webui XTC",
}


# where each preset's order comes from (engine, source); a preset missing here falls back to its registry summary
ORIGINS = {
    "llama.cpp": ("llama.cpp", "the default `samplers` list and values of llama.cpp's `common_params_sampling`"),
    "llama.cpp-mirostat": (
        "llama.cpp",
        "llama.cpp's `common_sampler_init` with `--mirostat 1`: temperature, then "
        "mirostat; llama.cpp drops every other sampler",
    ),
    "llama.cpp-mirostat-v2": (
        "llama.cpp",
        "llama.cpp's `common_sampler_init` with `--mirostat 2`: temperature, then "
        "mirostat v2; llama.cpp drops every other sampler",
    ),
    "transformers": (
        "transformers",
        "the processor order of transformers' `_get_logits_processor` at "
        "`GenerationConfig` defaults with `do_sample=True`",
    ),
    "vllm": ("vLLM", "the steps of vLLM's v1 `Sampler` at `SamplingParams` defaults"),
    "text-generation-webui": ("text-generation-webui", "text-generation-webui's default `sampler_priority`"),
    "text-generation-webui-temperature-last": (
        "text-generation-webui",
        "text-generation-webui's `sampler_priority` "
        "with `temperature_last`: temperature and quadratic moved to the end",
    ),
    "greedy": ("any", "a single selector: there is no order to take from an engine"),
    "reasoning-think": (
        "Qwen3 / DeepSeek-R1",
        "a thinking budget ([reasoning.md](reasoning.md)), then the "
        "thinking-mode sampling values of Qwen3's model card in llama.cpp's order",
    ),
    "reasoning-seed-think": ("Seed-OSS markers", "reasoning-think with `<seed:think>` / `</seed:think>`"),
    "reasoning-think-brackets": ("Magistral markers", "reasoning-think with `[THINK]` / `[/THINK]`"),
}

# prose for the keys of a chain table; the keys themselves come from the config loader (config._CHAIN_KEYS)
CHAIN_KEY_DOC = {
    "samplers": (
        "array of entry tables",
        "the chain, in order: transforms and filters, then exactly one selector, last",
    ),
    "stop": ("array of entry tables", "stopping criteria, combined by OR (the generation loop uses them)"),
    "backend": ("string", '`"auto"` (the installed backend for the logits\' device) or a backend name'),
    "nonfinite": (
        "string",
        '`"error"` (default): NaN or +inf logits are a `SamplingError` naming the request; '
        '`"sanitize"`: NaN becomes 0.0 and a row with +inf keeps only its +inf tokens (at 0.0), as '
        "transformers' InfNanRemoveLogitsProcessor; -inf stays masked either way",
    ),
    "name": ("string", "a label for the chain (a preset's is its name)"),
    "description": ("string", "free text"),
    "guards": (
        "array of guard tables",
        'rules that take text back: `[{ use = "banned_strings", phrases = ["a testament to"] }]` '
        "([guards.md](guards.md))",
    ),
    "draft": (
        "string or table",
        'the drafter generations with this chain speculate with: `{ use = "prompt_lookup", num_tokens = 8 }` or '
        "a bare name, usually written as a `[draft]` table beside `[chain]` ([speculative.md](speculative.md))",
    ),
}
# prose for the keys every entry of `samplers` / `stop` takes besides its plugin's parameters
ENTRY_KEY_DOC = {
    "use": ("required", "the sampler or criterion name: `top_p` means the newest version, `top_p.v1` pins one"),
    "id": ("the name", "a label for per-request parameters (`<id>.<field>`); needed when a sampler appears twice"),
}
GENERATED = (
    "Generated by `python scripts/sampler_catalogue.py` from the installed plugins and registry.toml; "
    "`tests/test_docs.py` checks it is current: edit the plugins or the script, not this file."
)


def _default(field: attrs.Attribute) -> str:
    """The default as TOML would write it (`true`, `"a"`, `[1, 2]`), "required" or "none"; `|` escaped for tables."""
    if field.default is attrs.NOTHING:
        return "required"
    value = field.default.factory() if isinstance(field.default, attrs.Factory) else field.default  # type: ignore
    return "none" if value is None else _toml(value).replace("|", "\\|")


def _anchor(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to dashes."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _section_link(name: str, page: Path, from_dir: Path) -> str:
    """A link to the heading of `page` that names `name` (headings like `## suppress_tokens, begin_suppress_tokens`)."""
    for line in page.read_text().splitlines():
        title = line.lstrip("#")
        if line.startswith("#") and name in [p.strip() for p in title.split(",")]:
            target = f"{os.path.relpath(page, from_dir)}#{_anchor(title)}"
            return f"[{target.rsplit('/', 1)[-1]}]({target})"
    return ""


def _doc_link(name: str, from_dir: Path = OUT.parent) -> str:
    """The sampler's own page in docs/samplers/, else its section of docs/semantics.md, linked from `from_dir`."""
    page = OUT.parent / f"{name}.md"
    if page.is_file():
        target = os.path.relpath(page, from_dir)
        return f"[{target.rsplit('/', 1)[-1]}]({target})"
    return _section_link(name, DOCS / "semantics.md", from_dir)


@lru_cache(maxsize=1)
def _host() -> Any:
    from samplechain import get_host

    host = get_host()
    host.load_all()
    return host


def _ours(kind: str) -> dict[str, dict[int, type]]:
    """What the plugins of this checkout's plugins/ register (third-party installs would make the docs depend on
    the machine that generated them)."""
    host = _host()
    ours = [e for e in host.registry.plugins.values() if e.kind == kind and e.path.startswith("plugins/")]
    return {n: v for n, v in sorted(host.registered(kind).items()) if any(n == e.name or n in e.provides for e in ours)}


def _newest(versions: Mapping[int, type]) -> type:
    return versions[max(versions)]


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def _type_name(kind: Any) -> str:
    if isinstance(kind, type) and not typing.get_args(kind):
        return kind.__name__
    return re.sub(r"\b(typing|collections\.abc)\.", "", str(kind))


def _allowed(field: attrs.Attribute) -> str:
    """The range or choices a field's validators enforce, as samplechain.params' validators declare them (the message
    in_range builds, one_of's choices); a validator that declares nothing readable is left out."""
    from samplechain.params import finite, validators

    parts = []
    for v in validators(field):
        if hasattr(v, "bounds"):
            parts.append(v.text.removeprefix("must be in "))
        elif hasattr(v, "choices"):
            parts.append("one of " + ", ".join(json.dumps(c) for c in v.choices))
        elif v is finite:
            parts.append("finite")
        elif inspect.isfunction(v) and v.__doc__:
            parts.append(v.__doc__.strip().splitlines()[0].removeprefix("attrs validator: "))
    return _cell("; ".join(parts))


def _field_comments(params_cls: type) -> dict[str, str]:
    """The trailing `# comment` of each field line in the Params class source: the plugins' own field notes."""
    try:
        source = inspect.getsource(params_cls)
    except (OSError, TypeError):
        return {}
    names = {f.name for f in attrs.fields(params_cls)}
    out: dict[str, str] = {}
    lines = source.splitlines()
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            m = re.match(r"\s*(\w+)\s*:", lines[tok.start[0] - 1])
            if m and m.group(1) in names:
                out[m.group(1)] = tok.string.lstrip("# ").strip()
    return out


def _field_doc(field: attrs.Attribute, comments: Mapping[str, str]) -> str:
    """Field metadata help first, then the field's source comment, then the docstring of the field factory."""
    from samplechain.params import is_seed_field, seed_field, token_ids_field, validators

    for key in ("help", "description", "doc"):
        if field.metadata.get(key):
            return _cell(str(field.metadata[key]))
    if field.name in comments:
        return _cell(comments[field.name])
    if is_seed_field(field):
        return _cell(seed_field.__doc__ or "")
    if any(getattr(v, "__name__", "") == "_token_ids_ok" for v in validators(field)):
        return _cell(token_ids_field.__doc__ or "")
    return ""


def _first_paragraph(doc: str | None) -> str:
    return " ".join(inspect.cleandoc(doc).split("\n\n")[0].split()) if doc else ""


def _description(cls: type) -> str:
    """The summary, then the class docstring's first paragraph, else the plugin module's."""
    summary = getattr(cls, "summary", "")
    own = cls.__dict__.get("__doc__")  # the class's own, never the contract's
    body = _first_paragraph(own) or _first_paragraph(sys.modules[cls.__module__].__doc__)
    return "\n\n".join(p for p in (summary and summary[0].upper() + summary[1:] + ".", body) if p)


def _per_request(name: str, cls: type, field: attrs.Attribute) -> str:
    """Flat aliases and `<id>.<field>` for the fields the request store keeps as per-row columns."""
    from samplechain.engine.store import _DTYPES

    kind = field.type
    if typing.get_args(kind) and type(None) in typing.get_args(kind):
        kind = next(a for a in typing.get_args(kind) if a is not type(None))
    if kind not in _DTYPES:
        return "chain only"
    aliases = [a for a, f in cls.request_aliases.items() if f == field.name and a != f"{name}.{field.name}"]
    return ", ".join(f"`{a}`" for a in [*aliases, f"{name}.{field.name}"])


def _param_table(name: str, cls: type, *, per_request: bool) -> list[str]:
    attrs.resolve_types(cls.Params)
    fields = attrs.fields(cls.Params)
    if not fields:
        return ["No parameters."]
    comments = _field_comments(cls.Params)
    head = ["parameter", "type", "default", "allowed", *(["per request"] if per_request else []), "description"]
    rows = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for f in fields:
        default = _default(f)
        default = default if default in ("required", "none") else f"`{default}`"
        cells = [f"`{f.name}`", f"`{_cell(_type_name(f.type))}`", default, _allowed(f)]
        if per_request:
            cells.append(_per_request(name, cls, f))
        rows.append("| " + " | ".join([*cells, _field_doc(f, comments)]) + " |")
    return rows


def _provider(kind: str, cls: type) -> str:
    info = _host().provider(kind, cls)
    return f"`{info.distribution}`" if info is not None and info.distribution else "—"


def render() -> str:
    """docs/samplers/README.md: one row per sampler."""
    registered = _ours("sampler")
    rows = []
    for name, versions in registered.items():
        cls = _newest(versions)
        params = ", ".join(f"`{f.name}` = {_default(f)}" for f in attrs.fields(cls.Params)) or "—"
        aliases = ", ".join(f"`{a}`" for a in cls.request_aliases) or "—"
        kind = f"{cls.stage.value} ({cls.effective_role()})" if cls.stage.value != "select" else "select"
        rows.append(f"| `{name}` | {kind} | {params} | {aliases} | {REFERENCES.get(name, '')} | {_doc_link(name)} |")
    head = [
        "# Sampler catalogue",
        "",
        "Every sampler the plugins in `plugins/` register (each its own distribution, installed by the README set-up),",
        "with its parameters and defaults, the flat per-request names (`store.add(id, {alias: value})`,",
        "`generate(params=...)`), the implementation it reproduces, and its page. Generated by",
        "`python scripts/sampler_catalogue.py` from the installed plugins; `tests/test_docs.py` checks it is current.",
        "The full parameter tables (types, ranges) are in [../reference.md](../reference.md).",
        "",
        "| sampler | stage (role) | parameters = default | per-request names | reference | doc |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    return "\n".join(head + rows) + "\n"


def _chain_structure() -> list[str]:
    """The chain file's keys, from the config loader: its key list, ChainConfig's defaults, EntrySpec's keys."""
    from samplechain.engine.backends import PRECEDENCE
    from samplechain.engine.config import _CHAIN_KEYS, ChainConfig, EntrySpec

    if set(CHAIN_KEY_DOC) != set(_CHAIN_KEYS):
        raise SystemExit(
            f"CHAIN_KEY_DOC in {Path(__file__).name} documents {sorted(CHAIN_KEY_DOC)} but the config "
            f"loader accepts {sorted(_CHAIN_KEYS)}: describe the new keys, drop the removed ones"
        )
    entry_fields = {f.name for f in attrs.fields(EntrySpec)}
    if not set(ENTRY_KEY_DOC) <= entry_fields:
        raise SystemExit(
            f"ENTRY_KEY_DOC in {Path(__file__).name} names {sorted(set(ENTRY_KEY_DOC) - entry_fields)}, "
            f"which EntrySpec no longer has: update ENTRY_KEY_DOC"
        )
    defaults = {f.name: f for f in attrs.fields(ChainConfig)}
    out = [
        "## The chain file",
        "",
        "A chain is a TOML file (or the same structure as a dict / JSON) holding one `[chain]` table, or the same",
        "keys at the top level. Unknown keys are errors, each reported as `FILE: KEY.PATH = VALUE: expectation`",
        "(see [configuration.md](configuration.md)). `Chain.load` takes a path, a TOML string, a dict, or",
        '`"preset:NAME"`.',
        "",
        "| key | type | default | meaning |",
        "| --- | --- | --- | --- |",
    ]
    for key in _CHAIN_KEYS:
        kind, meaning = CHAIN_KEY_DOC[key]
        default = _default(defaults[key]) if key in defaults else "none"
        default = default if default in ("required", "none") else f"`{default}`"
        out.append(f"| `{key}` | {kind} | {default} | {meaning} |")
    out += [
        "",
        "Each entry of `samplers` and `stop` is a table: these keys, plus the parameters of the sampler or criterion",
        "it names (its table below); an entry states its values, a parameter left out takes the default shown.",
        "",
        "| key | default | meaning |",
        "| --- | --- | --- |",
        *(f"| `{k}` | {d} | {m} |" for k, (d, m) in ENTRY_KEY_DOC.items()),
        "",
        f'`backend = "auto"` picks, in this precedence, the first available of: '
        f"{', '.join(f'`{b}`' for b in PRECEDENCE)} (for logits on a known device, that device's backend); "
        "a named backend that is missing or cannot run here is an error, never a silent fallback.",
        "",
    ]
    return out


def _per_request_prose() -> list[str]:
    from samplechain.engine.store import _DTYPES

    kinds = ", ".join(f"`{k.__name__}`" for k in _DTYPES)
    return [
        "## Per-request parameters",
        "",
        f"Sampler fields of type {kinds} (optional or not) are per-request columns: a request overrides them by",
        "`<entry id>.<field>` (the entry id is the sampler's name unless the entry sets `id`) or by a flat alias,",
        "which applies to every entry of the chain that has it. The *per request* column lists both; *chain only*",
        "fields (strings, lists, tables) are fixed by the chain file.",
        "",
    ]


def _presets_prose() -> list[str]:
    from samplechain.engine.config import _CHAIN_KEYS

    presets = _host().registry.presets
    keys = ", ".join(f"`{k}`" for k in ("summary", *_CHAIN_KEYS))
    return [
        "## Presets",
        "",
        '`Chain.load("preset:NAME")` (and `--preset NAME` on the command line) loads `[presets.NAME]` of',
        f"registry.toml: a chain table ({keys}) whose `name` is the preset's. A preset is a complete chain:",
        "there is no inheritance between presets or chain files. The presets, each as a chain file:",
        "[presets.md](presets.md): " + ", ".join(f"`{p}`" for p in presets) + ".",
        "",
    ]


def _plugin_section(
    name: str, cls: type, versions: dict, kind: str, facts: str, link: str | None, *, per_request: bool
) -> list[str]:
    """One reference section: heading (### for the newest version, #### for older ones), a line of facts with the
    providing distribution and the page, the description and the parameter table."""
    return [
        f"### `{name}`" if cls is _newest(versions) else f"#### `{cls.qualified_name()}`",
        "",
        f"`{cls.qualified_name()}`{facts} · from {_provider(kind, cls)}" + (f" · {link}" if link else ""),
        "",
        _description(cls),
        "",
        *_param_table(name, cls, per_request=per_request),
        "",
    ]


def render_reference() -> str:
    """docs/reference.md: the chain file's keys, then every sampler, criterion and backend with its schema."""
    from samplechain.contracts import Backend, Stage
    from samplechain.engine.discovery import _HOOKS

    out = [
        "# Chain-config reference",
        "",
        "Everything a chain file can say: its keys, then every sampler, stopping criterion and backend that the",
        "plugins in `plugins/` register, with each parameter's type, default and allowed values as their attrs",
        "schemas declare them.",
        "",
        GENERATED,
        "",
        *_chain_structure(),
        *_presets_prose(),
        *_per_request_prose(),
        "## Samplers",
        "",
        f"Registered through the `{_HOOKS['sampler']}` hook. Grouped by stage, in chain order: transforms, filters,",
        "then the selector that ends every chain.",
        "",
    ]
    samplers = _ours("sampler")
    for stage in Stage:
        for name, versions in samplers.items():
            if _newest(versions).stage is not stage:
                continue
            for cls in (versions[v] for v in sorted(versions, reverse=True)):
                role = "" if stage is Stage.SELECT else f" ({cls.effective_role()})"
                out += _plugin_section(
                    name, cls, versions, "sampler", f" · {stage.value}{role}", _doc_link(name, DOCS), per_request=True
                )
    out += [
        "## Stopping criteria",
        "",
        f"Registered through the `{_HOOKS['stopping_criterion']}` hook; entries of `stop = [...]`. A row stops",
        "when any criterion says so; its finish reason is the reason of the first one that did.",
        "",
    ]
    for name, versions in _ours("stopping_criterion").items():
        for cls in (versions[v] for v in sorted(versions, reverse=True)):
            limit = " · a length limit" if cls.is_length_limit else ""
            out += _plugin_section(
                name,
                cls,
                versions,
                "stopping_criterion",
                limit,
                _section_link(name, DOCS / "stopping.md", DOCS),
                per_request=False,
            )
    out += [
        "## Backends",
        "",
        f"Registered through the `{_HOOKS['backend']}` hook; chosen with `backend = ...` (see above).",
        "",
        "| backend | device | equivalence to the reference | availability | from | description |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for versions in _ours("backend").values():
        cls = _newest(versions)
        checked = cls.is_available.__func__ is not Backend.is_available.__func__  # type: ignore[attr-defined]
        availability = f"checked at run time by `{cls.__name__}.is_available()`" if checked else "always"
        out.append(
            f"| `{cls.name}.v{cls.version}` | `{cls.device_type}` | {cls.equivalence} | {availability} | "
            f"{_provider('backend', cls)} | {_cell(_description(cls))} |"
        )
    return "\n".join(out) + "\n"


def _toml(value: Any) -> str:
    """A TOML literal for the values registry.toml holds (numbers, strings, booleans, arrays, tables)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return repr(value) if math.isfinite(value) else ("nan" if math.isnan(value) else "inf" if value > 0 else "-inf")
    if isinstance(value, (int, str)):
        return json.dumps(value, ensure_ascii=False)  # JSON's string escapes are TOML's basic-string escapes
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    if isinstance(value, Mapping):
        items = ", ".join(f"{_key(k)} = {_toml(v)}" for k, v in value.items())
        return f"{{ {items} }}" if items else "{}"
    raise TypeError(f"cannot write {value!r} ({type(value).__name__}) as TOML")


def _key(key: str) -> str:
    return key if re.fullmatch(r"[A-Za-z0-9_-]+", key) else json.dumps(key, ensure_ascii=False)


def _preset_toml(name: str, table: Mapping[str, Any]) -> list[str]:
    """The preset as a chain file, exactly what Chain.from_preset loads (`name` set, `summary` as description)."""
    from samplechain.engine.config import _CHAIN_KEYS

    chain = {
        "name": name,
        **({"description": table["summary"]} if "summary" in table else {}),
        **{k: v for k, v in table.items() if k != "summary"},
    }
    order = ["name", "description", "backend", *_CHAIN_KEYS]  # the labels first, the long arrays last
    out = ["[chain]"]
    for key in sorted(chain, key=lambda k: order.index(k) if k in order else len(order)):
        value = chain[key]
        if key in ("samplers", "stop") and isinstance(value, list) and value:
            out += [f"{key} = [", *(f"  {_toml(v)}," for v in value), "]"]
        else:
            out.append(f"{_key(key)} = {_toml(value)}")
    return out


def _origin(name: str, table: Mapping[str, Any]) -> tuple[str, str]:
    if name in ORIGINS:
        return ORIGINS[name]
    engine = next((e for p, (e, _) in ORIGINS.items() if name.startswith(p + "-")), "—")
    return engine, table.get("summary", "")


def render_presets() -> str:
    """docs/presets.md: every preset of registry.toml, as the chain file it is."""
    registry = _host().registry
    out = [
        "# Presets",
        "",
        "The named chains of registry.toml: each engine's default sampler order with its default values. Samplers",
        "that are off by default are present at their disabled values, so a request switches one on by its usual",
        "name (`repeat_penalty`, `dry_multiplier`, `typical_p` ...) without another chain. Load one with",
        '`Chain.load("preset:NAME")`, `samplechain generate --preset NAME`, or copy its TOML below into a file and',
        "edit it. Parameters are described in [reference.md](reference.md); the engines' semantics and differences",
        "in [semantics.md](semantics.md#chain-order).",
        "",
        GENERATED,
        "",
        "| preset | engine | samplers | order from |",
        "| --- | --- | --- | --- |",
    ]
    for name, table in registry.presets.items():
        engine, origin = _origin(name, table)
        steps = " → ".join(s.get("use", "?") for s in table.get("samplers", []))
        out.append(f"| [`{name}`](#{_anchor(name)}) | {engine} | {steps} | {_cell(origin)} |")
    out.append("")
    for name, table in registry.presets.items():
        engine, origin = _origin(name, table)
        out += [
            f"## {name}",
            "",
            f"Engine: {engine}. Order: {origin}.",
            "",
            "```toml",
            *_preset_toml(name, table),
            "```",
            "",
        ]
    return "\n".join(out)


OUTPUTS: dict[Path, Callable[[], str]] = {OUT: render, REFERENCE: render_reference, PRESETS: render_presets}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 when a generated file is out of date")
    args = parser.parse_args(argv)
    stale = []
    for path, build in OUTPUTS.items():
        text = build()
        if args.check:
            if (path.read_text() if path.is_file() else "") != text:
                stale.append(path)
            continue
        path.write_text(text)
        print(f"wrote {path}")
    for path in stale:
        print(f"{path} is out of date: run python scripts/sampler_catalogue.py", file=sys.stderr)
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main())
