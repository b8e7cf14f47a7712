"""Models shipped inside the package.

``DEFAULT_MODEL`` is a small GPT-2 (about 4 M parameters) with its byte-level BPE tokenizer, trained on Python's
own documentation by ``scripts/train_default_model.py``. It loads offline with the usual transformers calls::

    from transformers import AutoModelForCausalLM, AutoTokenizer
    from samplechain.models import default_model_path

    path = default_model_path()
    model = AutoModelForCausalLM.from_pretrained(path)
    tokenizer = AutoTokenizer.from_pretrained(path)

It writes English-looking documentation prose; it is a fixture for exercising decoding, not a useful assistant.
The tokenizer has ``<|endoftext|>`` as bos and eos and, like GPT-2, no pad token.
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["DEFAULT_MODEL", "default_model_path"]

DEFAULT_MODEL: Path = Path(__file__).resolve().parent / "docs-gpt2"

_REQUIRED = ("config.json", "model.safetensors", "tokenizer.json")


def default_model_path() -> Path:
    """The folder of the embedded default model, after checking that its files are there.

    Raises FileNotFoundError, naming the script that rebuilds it, when the folder or one of its files is missing
    (for example in a checkout where the weights were stripped).
    """
    missing = [name for name in _REQUIRED if not (DEFAULT_MODEL / name).is_file()]
    if missing:
        raise FileNotFoundError(
            f"the default model is missing from {DEFAULT_MODEL} (no {', '.join(missing)}); "
            "rebuild it with: python scripts/train_default_model.py"
        )
    return DEFAULT_MODEL
