"""Decode with this repository's chain (chain.toml) and its own sampler (ban_digits.py) on samplechain's loop.

Called by `samplechain.integrations.hub.load_custom_generate(...).generate(model, ...)` (which registers ban_digits for the run
and passes `chain=` from chain.toml), or by transformers' `model.generate(custom_generate=..., chain=FILE)`.
"""

import sys
from pathlib import Path

from samplechain import Chain, ConfigError
from samplechain.generation import generate as samplechain_generate
from samplechain.integrations import as_custom_generate
from samplechain.integrations.hub import plugin_registered

from .ban_digits import BanDigits  # `from .x import` is what transformers' loader copies along

ban_digits = sys.modules[BanDigits.__module__]


def _chain(chain):
    if chain is None:
        here = Path(__file__).with_name("chain.toml")
        if not here.is_file():
            raise ConfigError(
                "this copy of custom_generate has no chain.toml next to it (transformers copies only "
                "the Python files): pass chain=<repo>/custom_generate/chain.toml"
            )
        chain = here
    return chain if isinstance(chain, Chain) else Chain.load(chain)


def generate(model, *args, chain=None, **kwargs):
    with plugin_registered(ban_digits, "custom-generate-chain:ban_digits"):
        chain = _chain(chain)
        if (
            "logits_processor" in kwargs
        ):  # transformers' model.generate(custom_generate=FOLDER) passes all its arguments
            decode = as_custom_generate(chain, tokenizer=kwargs.get("tokenizer"))
            return model.generate(*args, custom_generate=decode, **kwargs)
        return samplechain_generate(model, *args, chain=chain, **kwargs)
