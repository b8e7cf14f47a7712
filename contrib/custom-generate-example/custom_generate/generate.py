"""A `custom_generate` repo whose decoding is a samplechain chain, declared in TOML below.

    model.generate(**inputs, custom_generate="path/to/custom-generate-example", trust_remote_code=True,
                   tokenizer=tok, max_new_tokens=40, seed=7)

transformers copies this file alone (and the .py files it imports relatively) into its module cache and calls
`generate(model=..., **the arguments of model.generate)`, so a TOML file next to it would not be found there:
the chain is this module's `CHAIN` string. `chain=` (a TOML file path, TOML text, a dict or "preset:NAME")
replaces it for one call. The rest goes back to `model.generate` with samplechain's loop as the decoding
callable, so transformers still prepares the inputs and the generation config.
"""

from samplechain import Chain
from samplechain.integrations import as_custom_generate

# llama.cpp's default order, seeded per request by model.generate(seed=...)
CHAIN = """
[chain]
samplers = [
  { use = "top_k", k = 40 },
  { use = "top_p", p = 0.95 },
  { use = "min_p", p = 0.05 },
  { use = "temperature", t = 0.8 },
  { use = "dist" },
]
stop = [ { use = "stop_strings", strings = ["\\n\\n"] } ]
"""


def generate(model, *args, chain=None, **kwargs):
    decode = as_custom_generate(
        Chain.load(chain if chain is not None else CHAIN), tokenizer=kwargs.get("tokenizer")
    )  # the stop string needs the tokenizer
    return model.generate(*args, custom_generate=decode, **kwargs)
