"""Write the default model's GGUF in another llama.cpp quantization, for the benchmarks' `--gguf`.

The default model ships as Q4_1, which llama.cpp's CPU backend multiplies one token at a time: a call over k tokens
costs nearly k steps, so checking drafted tokens gains little there. Q8_0, Q4_0 and F16 have many-token kernels;
this rewrites the same weights in one of them (llama.cpp's own `llama_model_quantize`, offline):

    .venv/bin/python benchmarks/requantize.py Q8_0 /tmp/smollm2-q8_0.gguf
    .venv/bin/python benchmarks/bench_verify.py --engine llama.cpp --gguf /tmp/smollm2-q8_0.gguf --sections 1,3

Requantizing from Q4_1 rounds the Q4_1 values once more (F16 keeps them to within float16's rounding): the model
is the same up to that rounding, not bit for bit.
"""

from __future__ import annotations

import argparse
import ctypes
import sys

TYPES = ("Q8_0", "Q4_0", "F16")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("type", choices=TYPES)
    ap.add_argument("out", help="the GGUF file to write")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args(argv)
    import llama_cpp

    from samplechain.models import default_gguf_path

    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = getattr(llama_cpp, f"LLAMA_FTYPE_MOSTLY_{args.type}")
    params.allow_requantize = True
    params.nthread = args.threads
    source = str(default_gguf_path())
    rc = llama_cpp.llama_model_quantize(source.encode(), args.out.encode(), ctypes.byref(params))
    if rc != 0:
        print(f"llama_model_quantize({source!r} -> {args.out!r}, {args.type}) returned {rc}", file=sys.stderr)
        return 1
    print(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
