"""Write docs/samplers/README.md: the catalogue of every sampler the installed plugins register, with parameters,
defaults, per-request aliases, reference and documentation. tests/test_docs.py checks the file is current.

    python scripts/sampler_catalogue.py            # rewrite docs/samplers/README.md
    python scripts/sampler_catalogue.py --check    # exit 1 if it is out of date
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import attrs

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "docs" / "samplers" / "README.md"

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


def _default(field: attrs.Attribute) -> str:
    if field.default is attrs.NOTHING:
        return "required"
    value = field.default.factory() if isinstance(field.default, attrs.Factory) else field.default  # type: ignore
    if value is None:
        return "none"
    if isinstance(value, str):
        return repr(value).replace("'", '"').replace("|", "\\|")
    if isinstance(value, tuple):
        value = list(value)
    return str(value).replace("'", '"').replace("|", "\\|")


def _doc_link(name: str) -> str:
    if (OUT.parent / f"{name}.md").is_file():
        return f"[{name}.md]({name}.md)"
    semantics = (ROOT / "docs" / "semantics.md").read_text()
    for line in semantics.splitlines():
        if line.startswith("## ") and name in [p.strip() for p in line[3:].split(",")]:
            anchor = line[3:].strip().lower().replace(",", "").replace(" ", "-")
            return f"[semantics.md#{anchor}](../semantics.md#{anchor})"
    return ""


def render() -> str:
    from samplechain import get_host

    host = get_host()
    host.load_all()
    registered = host.registered("sampler")
    ours = {e.name: e for e in host.registry.plugins.values() if e.kind == "sampler" and e.path.startswith("plugins/")}
    names = sorted(n for n in registered if n in ours or any(n in e.provides for e in ours.values()))
    rows = []
    for name in names:
        versions = registered[name]
        cls = versions[max(versions)]
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
        "",
        "| sampler | stage (role) | parameters = default | per-request names | reference | doc |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    return "\n".join(head + rows) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 when docs/samplers/README.md is out of date")
    args = parser.parse_args(argv)
    text = render()
    if args.check:
        current = OUT.read_text() if OUT.is_file() else ""
        if current != text:
            print(f"{OUT} is out of date: run python scripts/sampler_catalogue.py", file=sys.stderr)
            return 1
        return 0
    OUT.write_text(text)
    print(f"wrote {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
