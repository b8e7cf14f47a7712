"""GPU benchmark: one sampling step of the presets and the common chains against FlashInfer and a torch sort-based
sampler (vLLM's fallback), and end to end generate() against model.generate on a Llama-3.2-1B-shaped model.

Kernels (one sampling step, V = 128256, B = 1, 8, 64, 256, 512, float32 and bf16 logits):

    chains      preset:llama.cpp, preset:transformers, preset:vllm, preset:text-generation-webui (their defaults),
                top_k 50 + top_p 0.9, top_p 0.9, min_p 0.05, plain dist; every row one request with its own seed,
                `chain.sample(logits, store, ids)` (accept=True), backend "cuda" (on --device cpu: "cpu")
    FlashInfer  what vLLM runs with FlashInfer for the same parameters: temperature divide, min_p mask (torch) when a
                top-k / top-p follows, then top_k_top_p_sampling_from_logits (per-row top_k / top_p tensors: the
                precompiled path), softmax + top_k_sampling_from_probs, softmax + top_p_sampling_from_probs,
                softmax + min_p_sampling_from_probs, or sampling_from_logits; optional (n/a when not importable)
    torch       vLLM's torch fallback: temperature, min_p mask, sort + top-k mask + top-p cumsum mask (topk when only
                top-k), softmax, exponential race q = empty_like(probs).exponential_(); probs.div(q).argmax(-1)
    max         one logits.max(-1): a single read of the logits that also finds an index (the floor)

Logits: `samplechain.tools.bench.make_logits` ("peaked": Zipf-like rows, top token p ~ 0.4); "bf16" rows are those
logits rounded to bfloat16 and upcast to float32 (ties at the k-th place, as a bf16 model's logits have). Chains
with history-reading samplers (the presets) get a 320-token history per row. Each call is timed alone: on cuda
synchronise, CUDA event, call, CUDA event, synchronise (so host-side launch time counts, as in a decode loop);
elsewhere time.perf_counter. The pipelines take turns in blocks of 5 calls after `--warmup` calls each; medians.

End to end: `samplechain.generation.generate()` against `model.generate` on a random-weight LlamaForCausalLM with
Llama-3.2-1B's shapes (hidden 2048, 16 layers, 32 heads, 8 kv heads, intermediate 8192, vocab 128256, tied
embeddings) in bf16, greedy and sampling (temperature 0.8 + top_k 50 + top_p 0.9, one seed per row), B = 1, 16,
64, prompt 32 random tokens, 64 new tokens (eos off on both sides); time per step = wall time / new tokens, the
median over `--e2e-repeats` runs, who goes first alternating.

    source .gpu/device_setup.sh && python3 benchmarks/bench_gpu.py --out gpu.md --json gpu.json
    .venv/bin/python benchmarks/bench_gpu.py --device cpu --tiny              # a dry run of everything, < 1 minute

`--profile N` profiles the eager step of up to N cells that miss their target (torch.profiler: kernels launched, host
waits and reads, the slowest kernels). scripts/gpu_check.py runs this benchmark as one part of the project's GPU check.

Targets (printed next to the results): every chain <= 1.5x FlashInfer at B >= 8 and <= 0.15 ms at B = 1;
generate() per step <= 1.0x model.generate when sampling and <= 0.9x greedy.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shlex
import statistics
import sys
import time
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import torch

import samplechain
from samplechain import Chain
from samplechain.engine import graphs
from samplechain.tools.bench import LOGIT_KINDS, make_history, make_logits, markdown_rows

__all__ = [
    "CHAINS",
    "DTYPES",
    "chain_params",
    "flashinfer_step",
    "torch_step",
    "Timer",
    "run_kernels",
    "run_e2e",
    "kernel_table",
    "e2e_table",
    "main",
]

# name -> the chain (a "preset:NAME" or the samplers of a chain dict)
CHAINS: dict[str, str | list[dict[str, Any]]] = {
    "preset:llama.cpp": "preset:llama.cpp",
    "preset:transformers": "preset:transformers",
    "preset:vllm": "preset:vllm",
    "preset:text-generation-webui": "preset:text-generation-webui",
    "top_k 50 + top_p 0.9": [{"use": "top_k", "k": 50}, {"use": "top_p", "p": 0.9}, {"use": "dist"}],
    "top_p 0.9": [{"use": "top_p", "p": 0.9}, {"use": "dist"}],
    "min_p 0.05": [{"use": "min_p", "p": 0.05}, {"use": "dist"}],
    "dist": [{"use": "dist"}],
}
DTYPES = ("float32", "bf16")
E2E_SAMPLING = [
    {"use": "temperature", "t": 0.8},
    {"use": "top_k", "k": 50},
    {"use": "top_p", "p": 0.9},
    {"use": "dist"},
]
E2E_GREEDY = [{"use": "greedy"}]
TARGET_B1_MS, TARGET_VS_FI = 0.15, 1.5
TARGET_E2E = {"sampling": 1.0, "greedy": 0.9}
HISTORY_LEN, PROMPT_IN_HISTORY = 320, 256
SEED = 1000

# --------------------------------------------------------------------------- sizes
FULL = dict(
    vocab=128256,
    batch="1,8,64,256,512",
    repeats=100,
    warmup=10,
    model="llama-3.2-1b",
    e2e_batch="1,16,64",
    prompt_len=32,
    new_tokens=64,
    e2e_repeats=3,
)
TINY = dict(
    vocab=2000,
    batch="1,8",
    repeats=5,
    warmup=2,
    model="tiny",
    e2e_batch="1,2",
    prompt_len=8,
    new_tokens=8,
    e2e_repeats=1,
)
MODELS = {
    "llama-3.2-1b": dict(
        hidden_size=2048,
        num_hidden_layers=16,
        num_attention_heads=32,
        num_key_value_heads=8,
        intermediate_size=8192,
        vocab_size=128256,
        head_dim=64,
        max_position_embeddings=131072,
        rope_theta=500000.0,
        tie_word_embeddings=True,
        rms_norm_eps=1e-5,
    ),
    "tiny": dict(
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=128,
        vocab_size=2000,
        head_dim=16,
        max_position_embeddings=512,
        tie_word_embeddings=True,
    ),
}


# --------------------------------------------------------------------------- chains and their peers
def chain_samplers(source: str | list[dict[str, Any]]) -> list[dict[str, Any]]:
    if isinstance(source, str):
        return list(samplechain.get_host().registry.presets[source[len("preset:") :]]["samplers"])
    return source


def chain_params(samplers: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The vLLM-style parameters of a chain (temperature t, top_k k (0: off), top_p p, min_p m) and its selector.
    Samplers at their disabled defaults (the presets' penalties, typical, xtc ...) have no peer and are ignored."""
    prm: dict[str, Any] = {"t": 1.0, "k": 0, "p": 1.0, "m": 0.0, "selector": samplers[-1]["use"]}
    for s in samplers:
        use = s["use"]
        if use in ("temperature", "temp_ext"):
            prm["t"] = float(s.get("t", 1.0))
        elif use == "top_k":
            prm["k"] = int(s.get("k", 0))
        elif use == "top_p":
            prm["p"] = float(s.get("p", 1.0))
        elif use == "min_p":
            prm["m"] = float(s.get("p", 0.0))
    return prm


def _temperature(logits: torch.Tensor, t: float) -> torch.Tensor:
    return logits if t == 1.0 else logits / t


def _min_p_mask(x: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
    """vLLM's apply_min_p (out of place): mask tokens with prob < min_p x the top prob."""
    probs = torch.softmax(x, dim=-1)
    keep = probs >= m.unsqueeze(1) * probs.amax(dim=-1, keepdim=True)
    return x.masked_fill(~keep, float("-inf"))


def _top_k_top_p(x: torch.Tensor, k: torch.Tensor | None, p: torch.Tensor | None) -> torch.Tensor:
    """vLLM's apply_top_k_top_p (the torch fallback): topk when only top-k, otherwise a full ascending sort."""
    if k is None and p is None:
        return x
    if p is None:  # apply_top_k_only
        assert k is not None
        kth = x.topk(int(k.max()), dim=1).values.gather(1, (k - 1).long().unsqueeze(1))
        return x.masked_fill(x < kth, float("-inf"))
    x_sort, x_idx = x.sort(dim=-1, descending=False)
    if k is not None:
        kth = x_sort.gather(1, (x_sort.size(1) - k.long()).unsqueeze(1))
        x_sort.masked_fill_(x_sort < kth, float("-inf"))
    probs_sum = x_sort.softmax(dim=-1).cumsum_(dim=-1)
    mask = probs_sum <= 1 - p.unsqueeze(1)
    mask[:, -1] = False  # at least one token
    x_sort.masked_fill_(mask, float("-inf"))
    return x_sort.scatter(dim=-1, index=x_idx, src=x_sort)


def torch_step(logits: torch.Tensor, prm: dict[str, Any]) -> tuple[Callable[[], torch.Tensor], str] | None:
    """One step of vLLM's torch sampler (forward_native + random_sample) with the chain's parameters."""
    batch, dev = logits.shape[0], logits.device
    k = torch.full((batch,), prm["k"], dtype=torch.int64, device=dev) if prm["k"] > 0 else None
    p = torch.full((batch,), prm["p"], dtype=torch.float32, device=dev) if prm["p"] < 1.0 else None
    m = torch.full((batch,), prm["m"], dtype=torch.float32, device=dev) if prm["m"] > 0 else None
    if prm["selector"] == "greedy":
        return (lambda: logits.argmax(dim=-1)), "argmax"
    if prm["selector"] != "dist":
        return None

    def step() -> torch.Tensor:
        x = _temperature(logits, prm["t"])
        if m is not None:
            x = _min_p_mask(x, m)
        x = _top_k_top_p(x, k, p)
        probs = x.softmax(dim=-1, dtype=torch.float32)
        q = torch.empty_like(probs).exponential_()
        return probs.div_(q).argmax(dim=-1)

    parts = (["/ t"] if prm["t"] != 1.0 else []) + (["min_p mask"] if m is not None else [])
    parts.append("sort + masks" if p is not None else ("topk mask" if k is not None else ""))
    return step, " -> ".join([x for x in parts if x] + ["softmax", "exponential race"])


def flashinfer_step(fi: Any, logits: torch.Tensor, prm: dict[str, Any]) -> tuple[Callable[[], Any], str] | None:
    """What vLLM runs with FlashInfer for the chain's parameters (`fi` is flashinfer.sampling); None: no peer."""
    if fi is None or prm["selector"] != "dist":
        return None
    batch, dev = logits.shape[0], logits.device
    k = torch.full((batch,), prm["k"], dtype=torch.int32, device=dev)  # tensors: FlashInfer's precompiled path
    p = torch.full((batch,), prm["p"], dtype=torch.float32, device=dev)
    m = torch.full((batch,), prm["m"], dtype=torch.float32, device=dev)
    t, has_k, has_p, has_m = prm["t"], prm["k"] > 0, prm["p"] < 1.0, prm["m"] > 0
    pre = "/ t -> " if t != 1.0 else ""

    if has_m and not (has_k or has_p):
        return (
            lambda: fi.min_p_sampling_from_probs(torch.softmax(_temperature(logits, t), dim=-1), m)
        ), pre + "softmax -> min_p_sampling_from_probs"
    pre += "min_p mask -> " if has_m else ""

    def x() -> torch.Tensor:
        y = _temperature(logits, t)
        return _min_p_mask(y, m) if has_m else y

    if has_k and has_p:
        return (lambda: fi.top_k_top_p_sampling_from_logits(x(), k, p)), pre + "top_k_top_p_sampling_from_logits"
    if has_k:
        return (
            lambda: fi.top_k_sampling_from_probs(torch.softmax(x(), dim=-1), k)
        ), pre + "softmax -> top_k_sampling_from_probs"
    if has_p:
        return (
            lambda: fi.top_p_sampling_from_probs(torch.softmax(x(), dim=-1), p)
        ), pre + "softmax -> top_p_sampling_from_probs"
    return (lambda: fi.sampling_from_logits(x())), pre + "sampling_from_logits"


def import_flashinfer() -> tuple[Any, str | None, str | None]:
    """(flashinfer.sampling or None, version, why not)."""
    try:
        import flashinfer
        import flashinfer.sampling as fi
    except Exception as exc:  # ImportError, or a broken build raising anything at import
        return None, None, f"{type(exc).__name__}: {exc}"
    return fi, getattr(flashinfer, "__version__", "?"), None


# --------------------------------------------------------------------------- timing
class Timer:
    """Milliseconds of one call: on cuda, CUDA events around it with the device synchronised before and after (the
    host's launch time counts, as in a decode loop that waits for its token); elsewhere time.perf_counter."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        if self.cuda:
            self.start, self.end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)

    def __call__(self, fn: Callable[[], Any]) -> float:
        if self.cuda:
            torch.cuda.synchronize()
            self.start.record()
            fn()
            self.end.record()
            self.end.synchronize()
            return float(self.start.elapsed_time(self.end))
        t0 = time.perf_counter()
        fn()
        return (time.perf_counter() - t0) * 1e3

    def sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize()


def time_turns(
    timer: Timer, fns: dict[str, Callable[[], Any]], repeats: int, warmup: int, block: int = 5
) -> tuple[dict[str, list[float]], dict[str, str]]:
    """ms of `repeats` calls of each fn after `warmup` calls each, taking turns in blocks of `block` calls. A fn that
    raises is dropped (its error returned) and the others go on."""
    errors: dict[str, str] = {}
    live = dict(fns)

    def failed(name: str, exc: Exception) -> None:
        errors[name] = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"[:200]
        del live[name]

    for name, fn in list(live.items()):
        try:
            for _ in range(warmup):
                fn()
            timer.sync()
        except Exception as exc:
            failed(name, exc)
    times: dict[str, list[float]] = {name: [] for name in live}
    while any(len(times[name]) < repeats for name in live):
        for name, fn in list(live.items()):
            try:
                for _ in range(min(block, repeats - len(times[name]))):
                    times[name].append(timer(fn))
            except Exception as exc:
                failed(name, exc)
                del times[name]
    return times, errors


# --------------------------------------------------------------------------- kernels
def _met(value: bool | None) -> str:
    return "n/a" if value is None else ("yes" if value else "NO")


def kernel_target(row: dict[str, Any]) -> tuple[str, bool | None]:
    """The GPU target for the step as generate() runs it: the better of the eager step and its graph replay."""
    best = min(v for v in (row["samplechain_ms"], row.get("graph_ms")) if v is not None)
    if row["batch"] == 1:
        return f"<= {TARGET_B1_MS:g} ms", best <= TARGET_B1_MS
    fi = row["flashinfer_ms"]
    return f"<= {TARGET_VS_FI:g}x FlashInfer", None if fi is None else best / fi <= TARGET_VS_FI


def run_kernels(
    device: torch.device,
    backend: str,
    chains: Sequence[str],
    dtypes: Sequence[str],
    batches: Sequence[int],
    vocab: int,
    kind: str,
    repeats: int,
    warmup: int,
    fi: Any,
    log: Callable[[str], None] = lambda s: None,
    profile: int = 0,
) -> tuple[list[dict[str, Any]], dict[str, dict[str, str]]]:
    """One row per (dtype, B, chain), and per chain the description of its peers. The first `profile` cells that miss
    their target (one per chain and dtype) get the eager step's profile in the row ("profile": `profile_step`)."""
    timer = Timer(device)
    profiled: set[tuple[str, str]] = set()
    built = {
        name: Chain.load(
            CHAINS[name] if isinstance(CHAINS[name], str) else {"chain": {"name": name, "samplers": CHAINS[name]}},
            backend=backend,
        )
        for name in chains
    }
    params = {name: chain_params(chain_samplers(CHAINS[name])) for name in chains}
    big = max(batches)
    base = make_logits(kind, big, vocab, seed=0)  # rows are independent: B rows = the first B of the largest batch
    history = None
    if any(c.needs_history for c in built.values()):
        history = make_history(big, vocab, HISTORY_LEN, seed=0).to(device)
    rows: list[dict[str, Any]] = []
    peers: dict[str, dict[str, str]] = {}
    for dtype in dtypes:
        full = base if dtype == "float32" else base.to(torch.bfloat16).to(torch.float32)
        full = full.to(device)
        for batch in batches:
            logits = full[:batch].contiguous()
            ids = [f"r{i}" for i in range(batch)]
            for name in chains:
                chain, prm = built[name], params[name]
                store = chain.new_store(capacity=batch)
                for i, rid in enumerate(ids):
                    store.add(rid, {"seed": SEED + i} if "seed" in store.layout.aliases else None)
                extra: dict[str, Any] = {}
                if chain.needs_history and history is not None:
                    extra = {
                        "history": history[:batch],
                        "prompt_lengths": torch.full((batch,), PROMPT_IN_HISTORY, dtype=torch.int64, device=device),
                    }
                fns: dict[str, Callable[[], Any]] = {
                    "samplechain": lambda c=chain, s=store, x=logits, r=ids, e=extra: c.sample(x, s, r, **e),
                    "max": lambda x=logits: x.max(dim=-1),
                }
                desc = {"samplechain": f"chain.sample, backend {backend!r}", "max": "logits.max(-1)"}
                graphed = graph_step(chain, batch, logits, extra)
                if graphed is not None:
                    fns["graph"], desc["graph"] = graphed
                for key, peer in (("flashinfer", flashinfer_step(fi, logits, prm)), ("torch", torch_step(logits, prm))):
                    if peer is not None:
                        fns[key], desc[key] = peer
                peers[name] = desc
                before = logits.clone()
                times, errors = time_turns(timer, fns, repeats, warmup)
                if not torch.equal(before, logits):
                    raise AssertionError(f"{name}: a pipeline modified the logits in place")
                med = {
                    k: (statistics.median(v) if v else None)
                    for k, v in ((k, times.get(k)) for k in ("samplechain", "graph", "flashinfer", "torch", "max"))
                }
                if med["samplechain"] is None:
                    raise RuntimeError(f"{name} {dtype} B={batch}: samplechain failed: {errors.get('samplechain')}")

                def over(a: str, b: str, med: dict[str, float | None] = med) -> float | None:
                    m, n = med[a], med[b]
                    return None if m is None or n is None else m / n

                row: dict[str, Any] = {
                    "chain": name,
                    "dtype": dtype,
                    "batch": batch,
                    "vocab": vocab,
                    "repeats": repeats,
                    **{f"{k}_ms": v for k, v in med.items()},
                    "samplechain_p90_ms": sorted(times["samplechain"])[int(0.9 * (len(times["samplechain"]) - 1))],
                    "samplechain_over_flashinfer": over("samplechain", "flashinfer"),
                    "graph_over_flashinfer": over("graph", "flashinfer"),
                    "samplechain_over_max": over("samplechain", "max"),
                    "torch_over_flashinfer": over("torch", "flashinfer"),
                    "samplechain_over_torch": over("samplechain", "torch"),
                    "errors": errors,
                }
                row["target"], row["met"] = kernel_target(row)
                if row["met"] is False and len(profiled) < profile and (name, dtype) not in profiled:
                    profiled.add((name, dtype))
                    row["profile"] = profile_step(fns["samplechain"], device)
                rows.append(row)
                log(
                    f"{name:28s} {dtype:7s} B={batch:<4d} samplechain {med['samplechain']:.3f} ms  graph "
                    f"{_ms(med['graph'])}  flashinfer "
                    f"{_ms(med['flashinfer'])}  torch {_ms(med['torch'])}  max {_ms(med['max'])}"
                    + (f"  errors: {errors}" if errors else "")
                )
    return rows, peers


def profile_step(fn: Callable[[], Any], device: torch.device, steps: int = 20) -> dict[str, Any]:
    """torch.profiler over `steps` calls of one step (after one unprofiled call), per step: the device kernels launched
    (on cpu: the aten ops run), the host waits (synchronising runtime calls: cuda*Synchronize, blocking copies), the
    host reads of device values (aten::_local_scalar_dense: `.item()`, `bool(tensor)` ...), and the five slowest
    kernels (ops) by their own time."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    cuda = device.type == "cuda"
    fn()
    if cuda:
        torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, *([ProfilerActivity.CUDA] if cuda else [])]) as prof:
        for _ in range(steps):
            fn()
        if cuda:
            torch.cuda.synchronize()
    events = list(prof.key_averages())

    def own_ms(e: Any) -> float:  # the event's own time, on the device for kernels
        us = getattr(e, "self_device_time_total", None) if cuda else None
        if us is None:
            us = getattr(e, "self_cuda_time_total", 0) if cuda else e.self_cpu_time_total
        return float(us) / 1e3 / steps

    if cuda:
        kernels = [e for e in events if e.device_type == DeviceType.CUDA]
    else:
        kernels = [e for e in events if e.key.startswith("aten::")]
    waits = sum(e.count for e in events if "Synchronize" in e.key or e.key in ("cudaMemcpy", "cudaStreamWaitEvent"))
    reads = sum(e.count for e in events if e.key == "aten::_local_scalar_dense")
    slowest = sorted(kernels, key=own_ms, reverse=True)[:5]
    return {
        "steps": steps,
        "kernels_per_step": sum(e.count for e in kernels) / steps,
        "host_waits_per_step": waits / steps,
        "host_reads_per_step": reads / steps,
        "kernel_ms_per_step": sum(own_ms(e) for e in kernels),
        "slowest": [
            {"name": e.key[:120], "ms_per_step": own_ms(e), "calls_per_step": e.count / steps} for e in slowest
        ],
    }


def profile_section(rows: Sequence[dict[str, Any]], device_type: str) -> list[str]:
    """Markdown lines for the profiled cells (none: no lines)."""
    profiled = [r for r in rows if r.get("profile")]
    if not profiled:
        return []
    what = "kernels" if device_type == "cuda" else "aten ops"
    out = ["", f"## Profiles of the cells that missed their target (torch.profiler, per step; {what})", ""]
    for r in profiled:
        p = r["profile"]
        slow = "; ".join(f"`{k['name']}` {k['ms_per_step']:.3f} ms x{k['calls_per_step']:g}" for k in p["slowest"])
        out.append(
            f"- {r['chain']} {r['dtype']} B={r['batch']}: {p['kernels_per_step']:g} {what}, "
            f"{p['host_waits_per_step']:g} host waits, {p['host_reads_per_step']:g} host reads, "
            f"{p['kernel_ms_per_step']:.3f} ms in {what}; slowest: {slow}"
        )
    return out


def _ms(v: float | None, digits: int = 3) -> str:
    return "n/a" if v is None else f"{v:.{digits}f}"


def _x(v: float | None) -> str:
    return "n/a" if v is None else f"{v:.2f}x"


def kernel_table(rows: Sequence[dict[str, Any]]) -> str:
    headers = [
        "chain",
        "logits",
        "B",
        "samplechain ms",
        "graph replay ms",
        "FlashInfer ms",
        "torch sort ms",
        "max(-1) ms",
        "samplechain / FlashInfer",
        "replay / FlashInfer",
        "samplechain / max",
        "samplechain / torch",
        "torch / FlashInfer",
        "target",
        "met",
    ]
    body = [
        [
            r["chain"],
            r["dtype"],
            str(r["batch"]),
            _ms(r["samplechain_ms"]),
            _ms(r["graph_ms"]),
            _ms(r["flashinfer_ms"]),
            _ms(r["torch_ms"]),
            _ms(r["max_ms"]),
            _x(r["samplechain_over_flashinfer"]),
            _x(r["graph_over_flashinfer"]),
            _x(r["samplechain_over_max"]),
            _x(r["samplechain_over_torch"]),
            _x(r["torch_over_flashinfer"]),
            r["target"],
            _met(r["met"]),
        ]
        for r in rows
    ]
    return markdown_rows(headers, body, right=set(range(2, 13)))


def graph_step(
    chain: Chain, batch: int, logits: torch.Tensor, extra: dict[str, Any]
) -> tuple[Callable[[], Any], str] | None:
    """The same step replayed from a CUDA graph (samplechain.engine.graphs.StepGraphs, its own store), or None where the
    step cannot be captured (no CUDA device, a host-bound sampler)."""
    ids = [f"g{i}" for i in range(batch)]
    store = chain.new_store(capacity=batch)
    for i, rid in enumerate(ids):
        store.add(rid, {"seed": SEED + i} if "seed" in store.layout.aliases else None)
    if graphs.graphs_unavailable_reason(chain, logits.device, store, ids):
        return None
    chain.sample(logits, store, ids, **extra)  # the eager first step: kernels compiled, caches filled
    step_graphs = graphs.StepGraphs(chain, store, ids)
    return (lambda: step_graphs.sample(logits, **extra)), "chain.sample replayed from a CUDA graph (StepGraphs)"


# --------------------------------------------------------------------------- end to end
def build_model(name: str, device: torch.device, dtype: torch.dtype) -> Any:
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(**MODELS[name], bos_token_id=1, eos_token_id=None, pad_token_id=0)
    torch.manual_seed(0)
    with torch.device(device):
        model = LlamaForCausalLM(config)
    model.to(dtype).eval()
    model.generation_config.eos_token_id = None  # every run generates exactly N tokens per row
    model.generation_config.pad_token_id = 0
    model.generation_config.bos_token_id = 1
    return model


def _ours(model: Any, ids: torch.Tensor, chain: Chain, n: int) -> torch.Tensor:
    from samplechain.generation import generate

    params = [{"seed": SEED + i} for i in range(ids.shape[0])] if not chain.is_greedy else None
    with warnings.catch_warnings(), torch.inference_mode():
        warnings.simplefilter("ignore")
        out = generate(
            model,
            input_ids=ids,
            attention_mask=torch.ones_like(ids),
            chain=chain,
            max_new_tokens=n,
            ignore_eos=True,
            pad_token_id=0,
            params=params,
        )
    return out.sequences


def _theirs(model: Any, ids: torch.Tensor, sampling: bool, n: int) -> torch.Tensor:
    kw: dict[str, Any] = dict(max_new_tokens=n, min_new_tokens=None, pad_token_id=0, eos_token_id=None)
    if sampling:
        kw.update(do_sample=True, temperature=0.8, top_k=50, top_p=0.9)
    else:
        kw.update(do_sample=False, temperature=None, top_k=None, top_p=None)
    with warnings.catch_warnings(), torch.inference_mode():
        warnings.simplefilter("ignore")
        return model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), **kw)


def run_e2e(
    model: Any,
    device: torch.device,
    backend: str,
    batches: Sequence[int],
    prompt_len: int,
    n: int,
    repeats: int,
    log: Callable[[str], None] = lambda s: None,
) -> list[dict[str, Any]]:
    timer = Timer(device)
    vocab = model.config.vocab_size
    rows = []
    for batch in batches:
        g = torch.Generator().manual_seed(batch)
        ids = torch.randint(10, vocab, (batch, prompt_len), generator=g).to(device)
        for setting in ("greedy", "sampling"):
            chain = Chain.load(
                {
                    "chain": {
                        "name": f"e2e {setting}",
                        "samplers": E2E_SAMPLING if setting == "sampling" else E2E_GREEDY,
                    }
                },
                backend=backend,
            )
            sampling = setting == "sampling"
            _ours(model, ids, chain, min(n, 4))  # warm-up both (allocator, kernels, caches)
            _theirs(model, ids, sampling, min(n, 4))
            timer.sync()
            ours_t, theirs_t = [], []
            out: dict[str, torch.Tensor] = {}

            def run_ours(out: dict[str, torch.Tensor] = out, ids: torch.Tensor = ids, chain: Chain = chain) -> None:
                out["ours"] = _ours(model, ids, chain, n)

            def run_theirs(
                out: dict[str, torch.Tensor] = out, ids: torch.Tensor = ids, sampling: bool = sampling
            ) -> None:
                out["theirs"] = _theirs(model, ids, sampling, n)

            for rep in range(repeats):  # alternating who goes first: a slow spell hits both alike
                order = [(run_ours, ours_t), (run_theirs, theirs_t)]
                for fn, sink in order if rep % 2 == 0 else order[::-1]:
                    sink.append(timer(fn))
            for key in ("ours", "theirs"):
                if out[key].shape != (batch, prompt_len + n):
                    raise AssertionError(f"{key} generated {tuple(out[key].shape)}, expected {(batch, prompt_len + n)}")
            same = bool(torch.equal(out["ours"].cpu(), out["theirs"].cpu())) if not sampling else None
            ours_ms, theirs_ms = statistics.median(ours_t) / n, statistics.median(theirs_t) / n
            ratio = ours_ms / theirs_ms
            rows.append(
                {
                    "setting": setting,
                    "batch": batch,
                    "prompt_len": prompt_len,
                    "new_tokens": n,
                    "repeats": repeats,
                    "samplechain_ms_per_step": ours_ms,
                    "model_generate_ms_per_step": theirs_ms,
                    "samplechain_over_model_generate": ratio,
                    "target": f"<= {TARGET_E2E[setting]:g}x model.generate",
                    "met": ratio <= TARGET_E2E[setting],
                    "same_tokens": same,
                }
            )
            log(
                f"e2e {setting:8s} B={batch:<3d} samplechain {ours_ms:.3f} ms/step  model.generate {theirs_ms:.3f} "
                f"ms/step  ratio {ratio:.2f}x" + ("" if same is None else f"  same tokens: {same}")
            )
    return rows


def e2e_table(rows: Sequence[dict[str, Any]]) -> str:
    headers = [
        "setting",
        "B",
        "samplechain generate() ms/step",
        "model.generate ms/step",
        "samplechain / model.generate",
        "target",
        "met",
        "same tokens",
    ]
    body = [
        [
            r["setting"],
            str(r["batch"]),
            _ms(r["samplechain_ms_per_step"]),
            _ms(r["model_generate_ms_per_step"]),
            _x(r["samplechain_over_model_generate"]),
            r["target"],
            _met(r["met"]),
            "n/a (sampling)" if r["same_tokens"] is None else ("yes" if r["same_tokens"] else "no"),
        ]
        for r in rows
    ]
    return markdown_rows(headers, body, right={1, 2, 3, 4})


# --------------------------------------------------------------------------- report
def environment(device: torch.device, backend: str, fi_version: str | None, fi_error: str | None) -> dict[str, Any]:
    def version(mod: str) -> str | None:
        try:
            return __import__(mod).__version__
        except Exception:
            return None

    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
    else:
        name = platform.processor() or platform.machine()
        try:
            from samplechain.tools.bench import _cpu_name

            name = _cpu_name()
        except Exception:
            pass
    return {
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
        "device": name,
        "device_type": device.type,
        "backend": backend,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "triton": version("triton"),
        "flashinfer": fi_version,
        "flashinfer_error": fi_error,
        "transformers": version("transformers"),
        "samplechain": getattr(samplechain, "__version__", "?"),
        "python": platform.python_version(),
        "torch_threads": torch.get_num_threads(),
        "command": shlex.join([os.path.basename(sys.executable), *sys.argv]),
    }


def report(
    env: dict[str, Any],
    args: argparse.Namespace,
    kernels: list[dict[str, Any]],
    peers: dict[str, dict[str, str]],
    e2e: list[dict[str, Any]],
) -> str:
    fi = env["flashinfer"] or f"not importable ({env['flashinfer_error']})"
    timing = (
        "CUDA events, device synchronised around every call" if env["device_type"] == "cuda" else "time.perf_counter"
    )
    out = [
        "# samplechain GPU benchmark" + (" (dry run)" if env["device_type"] != "cuda" else ""),
        "",
        f"- device: {env['device']} ({env['device_type']}, samplechain backend {env['backend']!r})",
        f"- torch {env['torch']} (CUDA {env['cuda']}), triton {env['triton'] or 'n/a'}, FlashInfer {fi}, "
        f"transformers {env['transformers']}, samplechain {env['samplechain']}, python {env['python']}",
        f"- command: `{env['command']}`",
        f"- date: {env['date']}",
        f"- timing: {timing}; medians; ms",
    ]
    if kernels:
        out += [
            "",
            f"## One sampling step: V = {args.vocab}, {args.kind} logits, {args.repeats} calls after "
            f"{args.warmup} warm-up calls per pipeline",
            "",
            f"Targets: every chain <= {TARGET_VS_FI:g}x FlashInfer at B >= 8, <= {TARGET_B1_MS:g} ms at B = 1. "
            "bf16 = the logits rounded to bfloat16, upcast to float32.",
            "",
            kernel_table(kernels),
            "",
            "Pipelines per chain:",
            "",
        ]
        for name, desc in peers.items():
            out.append(f"- {name}: FlashInfer: {desc.get('flashinfer', 'n/a')}; torch: {desc.get('torch', 'n/a')}")
        errs = [(r["chain"], r["dtype"], r["batch"], r["errors"]) for r in kernels if r["errors"]]
        if errs:
            out += ["", "Errors (those pipelines are n/a in their rows):", ""]
            out += [f"- {c} {d} B={b}: {e}" for c, d, b, e in errs]
        out += profile_section(kernels, env["device_type"])
    if e2e:
        shape = "Llama-3.2-1B-shaped" if args.model == "llama-3.2-1b" else f"{args.model}"
        out += [
            "",
            f"## End to end: generate() vs model.generate, random {shape} model in {args.model_dtype}, "
            f"prompt {args.prompt_len}, {args.new_tokens} new tokens, median of {args.e2e_repeats}",
            "",
            "Targets: generate() per step <= 1.0x model.generate when sampling (temperature 0.8 + top_k 50 + "
            "top_p 0.9), <= 0.9x greedy.",
            "",
            e2e_table(e2e),
        ]
    return "\n".join(out) + "\n"


# --------------------------------------------------------------------------- main
def _ints(text: str) -> list[int]:
    values = [int(x) for x in text.split(",") if x.strip()]
    if not values or min(values) < 1:
        raise SystemExit(f"{text!r}: give positive integers separated by commas")
    return values


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        description=(__doc__ or "").split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--device", default=None, help="cuda or cpu (default: cuda when available)")
    ap.add_argument("--backend", default=None, help="samplechain backend (default: cuda on cuda, cpu on cpu)")
    ap.add_argument(
        "--tiny", action="store_true", help=f"tiny sizes for a dry run (every size option below defaults to {TINY})"
    )
    ap.add_argument("--parts", default="kernels,e2e", help="kernels, e2e or both (default both)")
    ap.add_argument("--chains", default=",".join(CHAINS), help=f"comma-separated (default all: {', '.join(CHAINS)})")
    ap.add_argument("--dtypes", default=",".join(DTYPES), help="float32, bf16 (default both)")
    ap.add_argument("--kind", default="peaked", choices=list(LOGIT_KINDS), help="logits kind (default peaked)")
    ap.add_argument("--vocab", type=int, help=f"vocabulary (default {FULL['vocab']})")
    ap.add_argument("--batch", help=f"batch sizes of the step benchmark (default {FULL['batch']})")
    ap.add_argument("--repeats", type=int, help=f"timed calls per pipeline and cell (default {FULL['repeats']})")
    ap.add_argument("--warmup", type=int, help=f"untimed calls per pipeline and cell first (default {FULL['warmup']})")
    ap.add_argument("--no-flashinfer", action="store_true", help="do not import FlashInfer")
    ap.add_argument("--model", choices=list(MODELS), help=f"end-to-end model shape (default {FULL['model']})")
    ap.add_argument("--model-dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    ap.add_argument("--e2e-batch", help=f"batch sizes end to end (default {FULL['e2e_batch']})")
    ap.add_argument("--prompt-len", type=int, help=f"prompt tokens (default {FULL['prompt_len']})")
    ap.add_argument("--new-tokens", type=int, help=f"new tokens per run (default {FULL['new_tokens']})")
    ap.add_argument("--e2e-repeats", type=int, help=f"timed runs per cell and side (default {FULL['e2e_repeats']})")
    ap.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's)")
    ap.add_argument("--out", help="also write the Markdown report to this file")
    ap.add_argument("--json", help="also write every number and the environment as JSON")
    ap.add_argument("--quiet", action="store_true", help="no per-cell lines on stderr")
    ap.add_argument(
        "--profile",
        type=int,
        default=0,
        metavar="N",
        help="profile the eager step of up to N cells that miss their target, one per chain and dtype "
        "(torch.profiler: kernels, host waits and reads, the slowest kernels; default 0)",
    )
    args = ap.parse_args(argv)
    for key, value in (TINY if args.tiny else FULL).items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    args.device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    args.backend = args.backend or ("cuda" if torch.device(args.device).type == "cuda" else "cpu")
    args.parts = [p for p in args.parts.split(",") if p]
    args.chains = [c for c in args.chains.split(",") if c]
    args.dtypes = [d for d in args.dtypes.split(",") if d]
    for what, given, known in (
        ("part", args.parts, ("kernels", "e2e")),
        ("chain", args.chains, tuple(CHAINS)),
        ("dtype", args.dtypes, DTYPES),
    ):
        bad = [g for g in given if g not in known]
        if bad or not given:
            ap.error(f"unknown {what} {bad or given}: choose from {', '.join(known)}")
    if args.vocab < 200:
        ap.error("--vocab must be >= 200 (the presets' token history draws ids from [100, V))")
    if args.repeats < 1 or args.warmup < 0 or args.e2e_repeats < 1 or args.new_tokens < 1 or args.prompt_len < 1:
        ap.error("--repeats, --e2e-repeats, --new-tokens and --prompt-len must be >= 1, --warmup >= 0")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    fi, fi_version, fi_error = (None, None, "--no-flashinfer") if args.no_flashinfer else import_flashinfer()
    if fi is not None and device.type != "cuda":
        fi, fi_error = None, f"{fi_version} installed, but FlashInfer needs cuda"
    env = environment(device, args.backend, fi_version if fi is not None else None, fi_error)

    def log(line: str) -> None:
        if not args.quiet:
            print(line, file=sys.stderr, flush=True)

    log(f"device {env['device']}, backend {args.backend}, FlashInfer {env['flashinfer'] or fi_error}")
    kernels, peers, e2e = [], {}, []
    if "kernels" in args.parts:
        kernels, peers = run_kernels(
            device,
            args.backend,
            args.chains,
            args.dtypes,
            _ints(args.batch),
            args.vocab,
            args.kind,
            args.repeats,
            args.warmup,
            fi,
            log,
            profile=args.profile,
        )
    if "e2e" in args.parts:
        model = build_model(args.model, device, getattr(torch, args.model_dtype))
        e2e = run_e2e(
            model, device, args.backend, _ints(args.e2e_batch), args.prompt_len, args.new_tokens, args.e2e_repeats, log
        )
        del model
    text = report(env, args, kernels, peers, e2e)
    print(text, end="")
    if args.out:
        with open(args.out, "w") as fh:
            fh.write(text)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(
                {
                    "env": env,
                    "kernels": kernels,
                    "pipelines": peers,
                    "e2e": e2e,
                    "settings": {k: v for k, v in vars(args).items() if k not in ("out", "json")},
                },
                fh,
                indent=2,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
