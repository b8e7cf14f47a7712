"""Real small models and tokenizers for tests, built in-process (no download): byte-level BPE, Metaspace,
byte-fallback, WordPiece and fixed-piece tokenizers, a scripted language model and a seeded tiny GPT-2.

`samplechain.tools.testing` re-exports every name here.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, cast

import torch

from ..engine.chain import Chain

__all__ = [
    "TOKENIZER_TEXT",
    "ScriptedLM",
    "byte_bpe_tokenizer",
    "byte_fallback_tokenizer",
    "check_eos_ids_from_setup",
    "metaspace_tokenizer",
    "piece_ids",
    "pieces_tokenizer",
    "tiny_gpt2",
    "tiny_llama",
    "wordpiece_tokenizer",
]


_SAMPLE_TEXT = (
    "The quick brown fox jumps over the lazy dog. A list is a mutable sequence; a tuple is not. "
    "Naïve café owners in Zürich serve crème brûlée — 日本語のテキスト, emoji 🎉 and ümlauts. "
    "Functions return values; generators yield them one at a time. Stop here.\n\nNew paragraph.\n"
)


def byte_bpe_tokenizer(vocab_size: int = 300, text: str | None = None) -> Any:
    """A real byte-level BPE tokenizer (GPT-2 style, trained in-process with `tokenizers`) wrapped as a
    transformers PreTrainedTokenizerFast, with `<|endoftext|>` as bos and eos and no pad token (as GPT-2).
    Multi-byte characters outside the merges are split across several tokens."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=["<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator([text or _SAMPLE_TEXT] * 4, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<|endoftext|>", eos_token="<|endoftext|>")


TOKENIZER_TEXT = (
    "Stop the lastopper! The stopped stopwatch stops. Sentence one.\n\nSentence two: ends here. "
    "A list is a mutable sequence; tuples are immutable. Naïve café, 日本語のテキスト and 🎉 emoji. "
) * 3


def metaspace_tokenizer(text: str = TOKENIZER_TEXT) -> Any:
    """SentencePiece style, trained in-process on `text`: "▁" marks a space, no byte fallback."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always")
    tok.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="always")
    tok.train_from_iterator(
        [text] * 4, trainers.BpeTrainer(vocab_size=300, special_tokens=["<unk>", "<s>", "</s>"], show_progress=False)
    )
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>")


def byte_fallback_tokenizer(text: str = TOKENIZER_TEXT) -> Any:
    """Llama style: Metaspace merges learnt on the ASCII of `text`, every other character spelt as <0xNN> byte
    tokens (byte_fallback), "▁" for spaces and the leading one stripped when decoding."""
    import json

    from tokenizers import Tokenizer, decoders, models, normalizers
    from transformers import PreTrainedTokenizerFast

    state = json.loads(metaspace_tokenizer(text.encode("ascii", "ignore").decode()).backend_tokenizer.to_str())
    vocab, specials = state["model"]["vocab"], ["<unk>", "<s>", "</s>"]
    order = (
        specials + [f"<0x{b:02X}>" for b in range(256)] + [t for t in sorted(vocab, key=vocab.get) if t not in specials]
    )
    # each merge is a pair of tokens, as the JSON holds it ("a b" or ["a", "b"])
    merges = cast(
        list[tuple[str, str]],
        [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in state["model"]["merges"]],
    )
    tok = Tokenizer(
        models.BPE(
            vocab={t: i for i, t in enumerate(order)},
            merges=merges,
            unk_token="<unk>",
            byte_fallback=True,
            fuse_unk=True,
        )
    )
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    tok.decoder = decoders.Sequence(
        [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0)]
    )
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>")


def wordpiece_tokenizer(text: str = TOKENIZER_TEXT) -> Any:
    """BERT style, trained in-process on `text`: "##" continuations, no byte mode."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.decoder = decoders.WordPiece()
    tok.train_from_iterator(
        [text] * 4, trainers.WordPieceTrainer(vocab_size=300, special_tokens=["[UNK]", "[SEP]"], show_progress=False)
    )
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", sep_token="[SEP]")


def pieces_tokenizer(pieces: Sequence[str]) -> Any:
    """A byte-level tokenizer whose vocabulary is `<|endoftext|>` (id 0, eos), the 256 bytes, then exactly `pieces`,
    with no merges: `piece_ids(tok, [...])` spells any token sequence with them (text split where a test wants)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    from ..strings import gpt2_byte_decoder

    encode = {b: c for c, b in gpt2_byte_decoder().items()}
    vocab = {"<|endoftext|>": 0}
    for ch in sorted(pre_tokenizers.ByteLevel.alphabet()):
        vocab.setdefault(ch, len(vocab))
    for p in pieces:
        vocab.setdefault("".join(encode[b] for b in p.encode()), len(vocab))
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>")


def piece_ids(tokenizer: Any, pieces: Sequence[str]) -> list[int]:
    """The ids of `pieces` in a `pieces_tokenizer` (each piece one token: a vocabulary piece or a single byte)."""
    from ..strings import gpt2_byte_decoder

    encode = {b: c for c, b in gpt2_byte_decoder().items()}
    ids = [tokenizer.convert_tokens_to_ids("".join(encode[b] for b in p.encode())) for p in pieces]
    if None in ids:
        missing = pieces[ids.index(None)]
        raise ValueError(f"piece {missing!r} is not in the tokenizer: add it to pieces_tokenizer([...])")
    return ids


class ScriptedLM(torch.nn.Module):
    """A causal LM double for generate(): greedy decoding yields `rows[b]` token by token for prompt b, then
    `after` (eos by default). No KV cache: each call sees every token so far. `vocab_size` logit columns."""

    def __init__(self, rows: Sequence[Sequence[int]], vocab_size: int, *, after: int = 0) -> None:
        from transformers import PretrainedConfig

        super().__init__()
        self.rows, self.after = [list(r) for r in rows], after
        # PretrainedConfig takes a model's settings as **kwargs; its annotated signature lists only the common ones
        self.config = PretrainedConfig(vocab_size=vocab_size, eos_token_id=0, n_positions=1024)  # type: ignore[call-arg]
        self.generation_config = None
        self._width: int | None = None

    def prepare_inputs_for_generation(self, input_ids: torch.Tensor, **kwargs: Any) -> dict[str, Any]:
        if kwargs.get("is_first_iteration") or self._width is None:  # a new generation's prefill
            self._width = input_ids.shape[1]
        return {"input_ids": input_ids}

    def forward(self, input_ids: torch.Tensor, **kwargs: Any) -> Any:
        from transformers.modeling_outputs import CausalLMOutput

        assert self._width is not None  # set by prepare_inputs_for_generation, which generate() calls first
        step = input_ids.shape[1] - self._width
        logits = torch.zeros(input_ids.shape[0], 1, self.config.vocab_size)
        for b in range(input_ids.shape[0]):
            row = self.rows[b % len(self.rows)]
            logits[b, 0, row[step] if step < len(row) else self.after] = 10.0
        return CausalLMOutput(logits=logits)


def tiny_gpt2(
    vocab_size: int = 300,
    *,
    seed: int = 0,
    n_positions: int = 128,
    eos_token_id: int | None = 0,
    bos_token_id: int | None = 0,
    init: float = 0.5,
) -> Any:
    """A real, random-weight transformers GPT2LMHeadModel small enough for unit tests. `init` (the initializer
    range) is large so that greedy decoding does not just repeat the prompt's last token."""
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(seed)
    config = GPT2Config(
        n_layer=2,
        n_embd=32,
        n_head=2,
        vocab_size=vocab_size,
        n_positions=n_positions,
        bos_token_id=bos_token_id,
        eos_token_id=eos_token_id,
        initializer_range=init,
    )
    return GPT2LMHeadModel(config).eval()


def tiny_llama(vocab_size: int = 4096, *, seed: int = 0, sliding_window: int | None = None) -> Any:
    """A real, random-weight transformers decoder of three layers in a `model.layers` list, small enough for unit
    tests: a LlamaForCausalLM, or a MistralForCausalLM with that sliding window (4096: the repository's tiny
    tokenizer)."""
    import transformers

    torch.manual_seed(seed)
    shape: dict[str, Any] = {
        "vocab_size": vocab_size,
        "hidden_size": 32 if sliding_window is None else 64,
        "intermediate_size": 64 if sliding_window is None else 128,
        "num_hidden_layers": 3,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 256,
    }
    if sliding_window is None:
        return transformers.LlamaForCausalLM(transformers.LlamaConfig(**shape)).eval()
    config = transformers.MistralConfig(**shape, sliding_window=sliding_window)
    return transformers.MistralForCausalLM(config).eval()


def check_eos_ids_from_setup(
    entry: Mapping[str, Any], logits: torch.Tensor, eos: Sequence[int], **sample_args: Any
) -> None:
    """Contract test for samplers with an `eos_ids` parameter (contracts.EosIds): without ids and without
    `chain.prepare` a step fails naming eos_ids; after `chain.prepare(eos_token_ids=eos)` the chain behaves exactly
    as with `eos_ids = eos` given; negative ids are refused at load naming the key. `entry` is the sampler's chain
    entry without eos_ids; sample_args go to `chain.sample` (history=, prompt_lengths=)."""
    import pytest

    from ..errors import ConfigError, SamplingError

    def load(extra: Mapping[str, Any]) -> Chain:
        return Chain.load({"samplers": [{**entry, **extra}, {"use": "greedy"}]})

    bare = load({})
    with pytest.raises(SamplingError, match="eos_ids"):
        bare.sample(logits.clone(), **sample_args)
    bare.prepare(eos_token_ids=list(eos))
    got = bare.sample(logits.clone(), return_scores=True, **sample_args).scores
    want = load({"eos_ids": list(eos)}).sample(logits.clone(), return_scores=True, **sample_args).scores
    assert got is not None and want is not None  # asked for with return_scores=True
    assert torch.equal(got, want)
    assert not torch.equal(got, logits), "the sampler must act in this case for the check to mean anything"
    with pytest.raises(ConfigError, match="eos_ids"):
        load({"eos_ids": [-1]})
