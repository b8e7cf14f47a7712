"""Chain traces: what every sampler of a chain did to the distribution, step by step.

`trace_generation(model, tokenizer, prompt, chain=..., **generate_kwargs)` runs one generation with a `Tracer`
installed on a private copy of the chain and returns a `Trace`: per step and per stage, the candidate-set size
(finite candidates), the entropy (nats) of the softmax over those candidates, and the probability the stage's
distribution gives the token that was finally chosen, with the decoded text of that token.

How it records without changing results: `Chain(config)` builds fresh sampler instances; the tracer replaces that
copy's `samplers` tuple with `TracedSampler` proxies that delegate every call (`prepare`, `apply`, `select`,
`accept`, the capability methods) to the real sampler and only *read* the candidates it returns (statistics in
float64 on a copy). Nothing the sampler sees or returns is modified, no RNG is drawn, so the tokens are exactly
those of the same generation without tracing.

Stage 0 ("logits") is the chain's input: the model's distribution. The selector's stage is the distribution it
sampled from (the output of the last transform / filter), so its chosen probability is exp(logprob) of the step.
"""

from __future__ import annotations

import base64
import html
import io
import math
import textwrap
import warnings
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs
import torch

from ..contracts import Candidates, Sampler, SamplerSetup, StepContext
from ..engine.chain import Chain
from ..errors import ConfigError

__all__ = ["Tracer", "TracedSampler", "Trace", "StepTrace", "trace_generation", "traced_chain"]

INPUT_STAGE = "logits"


# --------------------------------------------------------------------------------------------------- recording
def distribution_stats(logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per row of (B, K) logits: (finite-candidate count (B,) int64, entropy in nats (B,) float64 of the softmax
    over the finite candidates, logsumexp (B,) float64). Reads only: works on a float64 copy."""
    x = logits.detach().to(torch.float64)
    finite = torch.isfinite(x)
    width = finite.sum(dim=1)
    safe = torch.where(finite, x, torch.full_like(x, float("-inf")))
    lse = torch.logsumexp(safe, dim=1)
    logp = safe - lse[:, None]
    terms = torch.where(finite, logp.exp() * logp, torch.zeros_like(x))
    entropy = (-terms.sum(dim=1)).clamp(min=0.0)
    return width, entropy, lse


@attrs.define
class _Snapshot:
    """One stage's output within the current step: its statistics and what is needed to look the chosen token up."""

    width: torch.Tensor  # (B,)
    entropy: torch.Tensor  # (B,)
    lse: torch.Tensor  # (B,)
    logits: torch.Tensor  # (B, K) a copy
    ids: torch.Tensor | None  # (B, K) a copy, None for the untouched vocabulary


@attrs.frozen
class StepTrace:
    """One chain.sample call: (S, B) tensors over stages x rows, and the tokens chosen (B,)."""

    widths: torch.Tensor  # int64
    entropies: torch.Tensor  # float64, nats
    chosen_probs: torch.Tensor  # float64
    token_ids: torch.Tensor  # int64


class Tracer:
    """Collects per-stage statistics of every `chain.sample` call of the chain it is installed on.

    `Tracer.install(chain)` replaces `chain.samplers` with proxies (do it on a chain of your own: `traced_chain`
    makes one). `steps` holds one `StepTrace` per completed sample call; `labels` names the stages, the chain's
    input ("logits") first."""

    def __init__(self, labels: Sequence[str], kinds: Sequence[str]) -> None:
        self.labels = [INPUT_STAGE, *labels]
        self.kinds = ["input", *kinds]
        self.steps: list[StepTrace] = []
        self._current: list[_Snapshot] = []
        self.on_step: Callable[[StepTrace], None] | None = None

    @classmethod
    def install(cls, chain: Chain) -> Tracer:
        if any(isinstance(s, TracedSampler) for s in chain.samplers):
            raise ConfigError("this chain is already traced")
        labels = _labels(chain)
        kinds = [spec.cls.stage.value for spec in chain.config.samplers]
        tracer = cls(labels, kinds)
        chain.samplers = tuple(TracedSampler(s, tracer, i) for i, s in enumerate(chain.samplers))
        return tracer

    # called by the proxies
    def _begin(self) -> None:
        self._current = []

    def _record(self, cand: Candidates) -> None:
        width, entropy, lse = distribution_stats(cand.logits)
        ids = None if cand.ids is None else cand.ids.detach().clone()
        self._current.append(_Snapshot(width, entropy, lse, cand.logits.detach().clone(), ids))

    def _finish(self, cand: Candidates, chosen: Any) -> None:
        snaps, self._current = self._current, []
        if not (
            isinstance(chosen, torch.Tensor) and chosen.dtype == torch.int64 and chosen.shape == (cand.batch_size,)
        ) or len(snaps) != len(self.labels):
            return  # the chain reports the bad selection (or this was not a full sample call)
        if bool(((chosen < 0) | (chosen >= cand.width)).any()):
            return
        tokens = cand.ids_at(chosen[:, None]).squeeze(1).detach().clone()
        probs = []
        for snap in snaps:
            if snap.ids is None:
                inside = tokens < snap.logits.shape[1]
                logit = snap.logits.gather(1, tokens.clamp(max=snap.logits.shape[1] - 1)[:, None]).squeeze(1)
                logit = torch.where(inside, logit, torch.full_like(logit, float("-inf")))
            else:
                match = snap.ids == tokens[:, None]
                logit = torch.where(match, snap.logits, torch.full_like(snap.logits, float("-inf"))).amax(dim=1)
            probs.append((logit.to(torch.float64) - snap.lse).exp().nan_to_num(0.0))
        step = StepTrace(
            torch.stack([s.width for s in snaps]).cpu(),
            torch.stack([s.entropy for s in snaps]).cpu(),
            torch.stack(probs).cpu(),
            tokens.cpu(),
        )
        self.steps.append(step)
        if self.on_step is not None:
            self.on_step(step)


def _labels(chain: Chain) -> list[str]:
    """A unique label per sampler: its id (the entry's `id`, else its name), numbered when repeated."""
    raw = [spec.id or spec.use for spec in chain.config.samplers]
    out = []
    for i, name in enumerate(raw):
        out.append(name if raw.count(name) == 1 else f"{name}#{raw[: i + 1].count(name)}")
    return out


class TracedSampler(Sampler):
    """A proxy for one sampler of a chain: delegates everything, records what `apply` returned (and, for the
    selector, the distribution it chose from and the token it chose)."""

    def __init__(self, inner: Sampler, tracer: Tracer, index: int) -> None:
        self.__dict__["inner"] = inner
        self.tracer = tracer
        self.index = index
        self.params = inner.params
        for attr in ("name", "version", "stage", "Params", "summary", "request_aliases", "role", "replaces_truncation"):
            setattr(self, attr, getattr(inner, attr))

    def __getattr__(self, name: str) -> Any:  # plugin-specific attributes (eos_tensor, compiled grammars ...)
        inner = self.__dict__.get("inner")
        if inner is None:
            raise AttributeError(name)
        return getattr(inner, name)

    def __repr__(self) -> str:
        return f"TracedSampler({self.inner!r})"

    def qualified_name(self) -> str:  # type: ignore[override]
        return self.inner.qualified_name()

    def effective_role(self) -> str:  # type: ignore[override]
        return self.inner.effective_role()

    def is_argmax_invariant(self) -> bool:
        return self.inner.is_argmax_invariant()

    def is_stateful(self) -> bool:
        return self.inner.is_stateful()

    def needs_history(self) -> bool:
        return self.inner.needs_history()

    def needs_unconditional_logits(self) -> bool:
        return self.inner.needs_unconditional_logits()

    def supported_devices(self) -> frozenset[str]:
        return self.inner.supported_devices()

    def state_spec(self) -> Mapping[str, Any]:
        return self.inner.state_spec()

    def prepare(self, setup: SamplerSetup) -> None:
        self.inner.prepare(setup)

    def apply(self, cand: Candidates, ctx: StepContext) -> Candidates:
        if self.index == 0:
            self.tracer._begin()
            self.tracer._record(cand)  # before the sampler may modify a writable input in place
        out = self.inner.apply(cand, ctx)
        self.tracer._record(out)
        return out

    def select(self, cand: Candidates, ctx: StepContext) -> torch.Tensor:
        if self.index == 0:  # a chain that is only a selector
            self.tracer._begin()
            self.tracer._record(cand)
        self.tracer._record(cand)
        chosen = self.inner.select(cand, ctx)
        self.tracer._finish(cand, chosen)
        return chosen

    def accept(self, ctx: StepContext, token_ids: torch.Tensor) -> Mapping[str, torch.Tensor]:
        return self.inner.accept(ctx, token_ids)


def traced_chain(chain: Any = None, *, model: Any = None, host: Any = None) -> tuple[Chain, Tracer]:
    """A fresh copy of `chain` (a Chain, a TOML path, a dict, "preset:NAME"; None: the model's generation config)
    with a Tracer installed. The chain given is never modified."""
    from ..engine.discovery import get_host
    from ..engine.mixed import MixedChains

    host = host or get_host()
    if isinstance(chain, (MixedChains, list, tuple)):
        raise ConfigError("trace runs one chain: give a single Chain, TOML file, dict or 'preset:NAME'")
    if chain is None:
        from ..generation.from_config import chain_from_generation_config

        copy = chain_from_generation_config(getattr(model, "generation_config", None), host=host)
    elif isinstance(chain, Chain):
        copy = Chain(chain.config, host=chain.host, backend=chain.backend_name)
    else:
        copy = Chain.load(chain, host=host)
    return copy, Tracer.install(copy)


# --------------------------------------------------------------------------------------------------- the result
@attrs.define
class Trace:
    """A traced generation. Tensors are (steps, stages) for request `request` (default 0) through the accessors.

    labels / kinds: one per stage ("logits" / "input" first, then each sampler with its stage kind).
    pieces[r][t]: the text step t of request r added (its delta of the decoded text; "" while a multi-byte
    character is incomplete); tokens[r][t]: the raw token string; texts[r]: the whole decoded continuation."""

    prompts: list[str]
    labels: list[str]
    kinds: list[str]
    steps: list[StepTrace]
    num_generated: list[int]
    token_ids: list[list[int]]
    tokens: list[list[str]]
    pieces: list[list[str]]
    texts: list[str]
    chain_repr: str = ""
    output: Any = None

    # ------------------------------------------------------------ tables
    def _n(self, request: int) -> int:
        return self.num_generated[request]

    def widths(self, request: int = 0) -> torch.Tensor:
        return (
            torch.stack([s.widths[:, request] for s in self.steps[: self._n(request)]])
            if self._n(request)
            else torch.zeros(0, len(self.labels), dtype=torch.int64)
        )

    def entropies(self, request: int = 0) -> torch.Tensor:
        return (
            torch.stack([s.entropies[:, request] for s in self.steps[: self._n(request)]])
            if self._n(request)
            else torch.zeros(0, len(self.labels), dtype=torch.float64)
        )

    def chosen_probs(self, request: int = 0) -> torch.Tensor:
        return (
            torch.stack([s.chosen_probs[:, request] for s in self.steps[: self._n(request)]])
            if self._n(request)
            else torch.zeros(0, len(self.labels), dtype=torch.float64)
        )

    def rows(self, request: int = 0) -> list[dict[str, Any]]:
        """One dict per generated step of the request: step (1-based), token_id, token (raw), text (decoded
        piece), and stages: a list of {stage, kind, width, entropy, chosen_prob} in chain order."""
        out = []
        widths, ents, probs = self.widths(request), self.entropies(request), self.chosen_probs(request)
        for t in range(self._n(request)):
            stages = [
                {
                    "stage": label,
                    "kind": kind,
                    "width": int(widths[t, s]),
                    "entropy": float(ents[t, s]),
                    "chosen_prob": float(probs[t, s]),
                }
                for s, (label, kind) in enumerate(zip(self.labels, self.kinds))
            ]
            out.append(
                {
                    "step": t + 1,
                    "token_id": self.token_ids[request][t],
                    "token": self.tokens[request][t],
                    "text": self.pieces[request][t],
                    "stages": stages,
                }
            )
        return out

    def effective_stages(self, request: int = 0) -> list[int]:
        """Stages worth showing: the input, the selector, and every stage that changed the candidate count or the
        entropy at some step (a sampler at its disabled value leaves both as they were)."""
        widths, ents = self.widths(request), self.entropies(request)
        keep = []
        last = len(self.labels) - 1
        for s in range(len(self.labels)):
            if s in (0, last) or widths.shape[0] == 0:
                keep.append(s)
                continue
            same = bool((widths[:, s] == widths[:, s - 1]).all()) and bool(
                torch.allclose(ents[:, s], ents[:, s - 1], rtol=0, atol=1e-9)
            )
            if not same:
                keep.append(s)
        return keep

    def tick_labels(self, request: int = 0) -> list[str]:
        """Each step's decoded piece made visible (the raw token while a character is incomplete; blanks as ␣)."""
        out = []
        for piece, token in zip(self.pieces[request][: self._n(request)], self.tokens[request]):
            text = _visible(piece or token)
            out.append(text.replace(" ", "␣") if not text.strip() else text)
        return out

    # ------------------------------------------------------------ outputs
    def to_png(self, path: str | Path, request: int = 0, *, dpi: int = 110) -> Path:
        """Write the trace plot (matplotlib, Agg canvas): candidates per stage (log scale), entropy per stage,
        chosen-token probability per stage; x = step, labelled with each step's decoded text."""
        path = Path(path)
        path.write_bytes(self.png_bytes(request, dpi=dpi))
        return path

    def png_bytes(self, request: int = 0, *, dpi: int = 110) -> bytes:
        import matplotlib
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure

        n = self._n(request)
        x = list(range(1, n + 1))
        widths, ents, probs = self.widths(request), self.entropies(request), self.chosen_probs(request)
        shown = self.effective_stages(request)
        hidden = [self.labels[s] for s in range(len(self.labels)) if s not in shown]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # glyphs missing from the font for exotic token text
            fig = Figure(figsize=(min(max(8.0, 3.0 + 0.28 * n), 48.0), 9.5), layout="constrained")
            FigureCanvasAgg(fig)
            axes = fig.subplots(3, 1, sharex=True)
            colors = matplotlib.colormaps["tab10"]
            markers = "os^vDP*Xhp"
            last = len(self.labels) - 1
            for j, s in enumerate(shown):
                if s == last:  # the selector's distribution is the last stage's: drawn on top, dotted
                    style = dict(
                        color="black",
                        marker=".",
                        markersize=3,
                        linewidth=1.0,
                        linestyle=":",
                        label=_tex_safe(f"{self.labels[s]} (sampled)"),
                        zorder=5,
                    )
                else:
                    style = dict(
                        color=colors(j % 10),
                        marker=markers[j % len(markers)],
                        markersize=4,
                        linewidth=1.4,
                        label=_tex_safe(self.labels[s]),
                        linestyle="-" if j < 10 else "--",
                    )
                axes[0].plot(x, widths[:, s].tolist(), **style)
                axes[1].plot(x, ents[:, s].tolist(), **style)
                axes[2].plot(x, probs[:, s].tolist(), **style)
            axes[0].set_yscale("log")
            axes[0].set_ylabel("candidates (finite)")
            axes[1].set_ylabel("entropy (nats)")
            axes[2].set_ylabel("P(chosen token)")
            axes[2].set_ylim(-0.03, 1.03)
            for ax in axes:
                ax.grid(True, alpha=0.3)
            axes[0].legend(loc="upper left", bbox_to_anchor=(1.005, 1.0), fontsize=8, title="stage", title_fontsize=8)
            labels = self.tick_labels(request)
            every = max(1, math.ceil(n / 120))
            axes[2].set_xticks(x[::every])
            axes[2].set_xticklabels(
                [_tex_safe(t) for t in labels[::every]], rotation=90, fontsize=8, fontfamily="monospace"
            )
            axes[2].set_xlabel("step (decoded token)")
            text = _visible(self.texts[request], keep_newlines=False)
            title = textwrap.shorten(f"{self.prompts[request]} ▸ {text}", width=220, placeholder=" …")
            fig.suptitle(_tex_safe("\n".join(textwrap.wrap(title, width=110)[:3])), fontsize=10, ha="left", x=0.01)
            if hidden:
                axes[0].set_title(
                    _tex_safe(f"no effect (hidden): {', '.join(hidden)}"), fontsize=8, loc="left", color="0.4"
                )
            buf = io.BytesIO()
            fig.savefig(buf, format="png", dpi=dpi)
        return buf.getvalue()

    def to_html(self, path: str | Path, request: int = 0) -> Path:
        """Write a self-contained page: the text, the plot (embedded PNG) and a steps x stages table."""
        path = Path(path)
        path.write_text(self.html(request), encoding="utf-8")
        return path

    def html(self, request: int = 0) -> str:
        esc = html.escape
        png = base64.b64encode(self.png_bytes(request)).decode("ascii")
        head = "".join(
            f"<th>{esc(label)}<br><small>{esc(kind)}</small></th>" for label, kind in zip(self.labels, self.kinds)
        )
        body = []
        for row in self.rows(request):
            cells = "".join(
                f"<td>{st['width']}<br><small>H {st['entropy']:.3f} · p {st['chosen_prob']:.4f}</small></td>"
                for st in row["stages"]
            )
            final = row["stages"][-1]["chosen_prob"]
            body.append(
                f'<tr class="step"><td>{row["step"]}</td><td class="tok">{esc(_visible(row["text"]))}</td>'
                f"<td>{row['token_id']}</td><td>{final:.4f}</td>{cells}</tr>"
            )
        prompt, text = self.prompts[request], self.texts[request]
        return _PAGE.format(
            title=esc(textwrap.shorten(f"trace: {prompt}", width=80)),
            chain=esc(self.chain_repr),
            prompt=esc(prompt),
            text=esc(text),
            n=self._n(request),
            png=png,
            head=head,
            body="\n".join(body),
        )

    def rich_table(self, request: int = 0, *, max_rows: int | None = None) -> Any:
        """A compact rich Table: step, text, then candidates and entropy for the stages that had an effect, and
        the chosen token's final probability."""
        from rich.markup import escape
        from rich.table import Table

        shown = self.effective_stages(request)
        hidden = [self.labels[s] for s in range(len(self.labels)) if s not in shown]
        caption = "cells: candidates / entropy (nats); p: chosen token's probability in the sampled distribution"
        if hidden:
            caption += f"; no effect: {', '.join(hidden)}"
        table = Table(
            title=f"chain trace ({self._n(request)} steps)",
            caption=escape(caption),
            box=None,
            pad_edge=False,
            header_style="bold",
        )
        table.add_column("#", justify="right", style="dim")
        table.add_column("text", overflow="fold", max_width=16)
        for s in shown:
            table.add_column(escape(self.labels[s]), justify="right")
        table.add_column("p", justify="right")
        rows = self.rows(request)
        if max_rows is not None and len(rows) > max_rows:
            rows = rows[:max_rows]
        for row in rows:
            cells = [f"{row['stages'][s]['width']}[dim]/{row['stages'][s]['entropy']:.2f}[/dim]" for s in shown]
            table.add_row(
                str(row["step"]), escape(repr(row["text"])[1:-1]), *cells, f"{row['stages'][-1]['chosen_prob']:.3f}"
            )
        return table


def _visible(text: str, *, keep_newlines: bool = False) -> str:
    """Token text made visible: newlines and tabs as \\n / \\t, other control characters escaped."""
    out = []
    for ch in text:
        if ch == "\n":
            out.append("\n" if keep_newlines else "\\n")
        elif ch == "\t":
            out.append("\\t")
        elif ord(ch) < 32 or ord(ch) == 127:
            out.append(f"\\x{ord(ch):02x}")
        else:
            out.append(ch)
    return "".join(out) if out else ""


def _tex_safe(text: str) -> str:
    """Text for matplotlib: a literal $ (mathtext would read $...$ as a formula)."""
    return text.replace("$", r"\$")


_PAGE = """<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>{title}</title>
<style>
body {{ font-family: system-ui, sans-serif; margin: 1.5em; color: #222; }}
.text {{ white-space: pre-wrap; background: #f6f6f6; padding: .8em; border-radius: 4px; font-family: monospace; }}
.text b {{ color: #555; }}
img {{ max-width: 100%; }}
table {{ border-collapse: collapse; font-size: 12px; }}
th, td {{ border: 1px solid #ddd; padding: 2px 6px; text-align: right; vertical-align: top; }}
th {{ background: #eee; position: sticky; top: 0; }}
td.tok {{ text-align: left; font-family: monospace; white-space: pre; }}
small {{ color: #666; }}
</style>
</head>
<body>
<h1>Chain trace</h1>
<p><code>{chain}</code></p>
<div class="text"><b>{prompt}</b>{text}</div>
<p>{n} steps. Per stage: candidates (finite), entropy H (nats) of the softmax over them, and p, the probability
that stage's distribution gives the token finally chosen. "logits" is the model's distribution before the chain;
the selector's column is the distribution it sampled from.</p>
<img alt="trace plot" src="data:image/png;base64,{png}">
<table>
<thead><tr><th>step</th><th>text</th><th>id</th><th>p</th>{head}</tr></thead>
<tbody>
{body}
</tbody>
</table>
</body>
</html>
"""


# --------------------------------------------------------------------------------------------------- running
def trace_generation(
    model: Any,
    tokenizer: Any,
    prompt: str | Sequence[str],
    *,
    chain: Any = None,
    progress: Callable[[int, int | None], None] | None = None,
    **generate_kwargs: Any,
) -> Trace:
    """Run `generate(model, tokenizer, prompt, chain=chain, **generate_kwargs)` with a tracer on a copy of the
    chain and return the Trace (its `.output` is the GenerationOutput, identical to an untraced run).

    progress: called as progress(step, max_new_tokens or None) after every step. Beam search is not traced."""
    from ..generation import Generation, IncrementalDecoder

    if generate_kwargs.pop("num_beams", 1) != 1:
        raise ConfigError("trace follows one sampled sequence per request: beam search (num_beams > 1) is not traced")
    copy, tracer = traced_chain(chain, model=model, host=generate_kwargs.get("host"))
    if chain is None:  # as generate() with no chain: the model's generation config is the chain, no warning
        generate_kwargs.setdefault("generation_config", getattr(model, "generation_config", None))
    gen = Generation(model, tokenizer, prompt, chain=copy, **generate_kwargs)
    total = generate_kwargs.get("max_new_tokens")
    rows = len(gen.request_ids)
    decoders = [IncrementalDecoder(tokenizer) for _ in range(rows)] if tokenizer is not None else []
    pieces: list[list[str]] = [[] for _ in range(rows)]
    ids: list[list[int]] = [[] for _ in range(rows)]
    step = 0
    for tokens, active in gen.steps():
        step += 1
        for b in active.nonzero().flatten().tolist():
            token = int(tokens[b])
            ids[b].append(token)
            if decoders:
                text = decoders[b].push(token)
                if gen.finish_reasons[b] is not None:
                    text += decoders[b].flush()
                pieces[b].append(text)
        if progress is not None:
            progress(step, total)
    out = gen.output()
    if len(tracer.steps) != step:  # pragma: no cover - a chain.sample call outside the traced path
        raise RuntimeError(f"the tracer saw {len(tracer.steps)} sample calls for {step} steps")
    num = [len(r) for r in ids]
    convert = getattr(tokenizer, "convert_ids_to_tokens", None)
    tokens_raw = [[str(t) for t in convert(r)] if convert else [str(t) for t in r] for r in ids]
    pieces = [p if decoders else [""] * len(r) for p, r in zip(pieces, ids)]
    prompts = [prompt] if isinstance(prompt, str) else list(prompt)
    if gen.n > 1:
        prompts = [p for p in prompts for _ in range(gen.n)]
    texts = list(out.texts) if out.texts else ["".join(p) for p in pieces]
    return Trace(
        prompts, tracer.labels, tracer.kinds, tracer.steps, num, ids, tokens_raw, pieces, texts, repr(copy), out
    )
