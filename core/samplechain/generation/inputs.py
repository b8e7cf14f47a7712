"""The rows a generation starts from: prompts (text, chat conversations or input_ids) and the negative prompts of
classifier-free guidance, left-padded with the pad token a generation chooses.

A prompt is text or a conversation: a list of messages `{"role": ..., "content": ...}`, rendered with the
tokenizer's chat template (the generation prompt added, as vLLM's `LLM.chat` does). `prompts` is one prompt or a list
of them: a list whose items are all messages is one conversation, any other list is a batch."""

from __future__ import annotations

import numbers
import warnings
from collections.abc import Mapping, Sequence
from typing import Any, TypeAlias

import torch

from ..contracts import max_positions, token_id_list
from ..engine.discovery import PluginHost, get_host
from ..engine.mixed import MixedChains
from ..engine.stopping import Stopping
from ..errors import ConfigError, GenerationWarning
from ..tokens import left_pad

__all__ = [
    "Conversation",
    "Message",
    "PromptInputs",
    "Prompts",
    "chat_template_of",
    "checked_flags",
    "checked_host",
    "checked_params",
    "checked_processor",
    "checked_stop",
    "checked_token_ids",
    "is_flag",
    "prompt_texts",
    "strings_of",
]

Message: TypeAlias = Mapping[str, Any]  # {"role": "user", "content": "..."}
Conversation: TypeAlias = Sequence[Message]
Prompts: TypeAlias = str | Conversation | Sequence[str | Conversation]


def checked_flags(**flags: Any) -> None:
    """generate()'s on/off arguments are bools (0 / 1 and None, the default, pass): `ignore_eos="no"` would otherwise
    read as true."""
    for name, value in flags.items():
        if value is None or is_flag(value):
            continue
        raise ConfigError(f"{name} = {value!r}: True or False")


def is_flag(value: Any) -> bool:
    """True, False, or what equals one of them (0, 1, numpy's bools; not "no" or 0.0)."""
    try:  # a tensor of several values has no truth value: no flag
        return not isinstance(value, (str, float)) and any(value is v or bool(value == v) for v in (0, 1))
    except (TypeError, ValueError, RuntimeError):
        return False


def checked_host(host: Any) -> PluginHost:
    """`host=`: a PluginHost, or None for the installed plugins' host."""
    if host is not None and not isinstance(host, PluginHost):
        raise ConfigError(f"host = {host!r}: a samplechain PluginHost (or leave it out for the installed plugins)")
    return host or get_host()


def checked_stop(stop: Any) -> list[Any]:
    """`stop=`: a list of stopping criteria (each checked where the criteria are built)."""
    if not isinstance(stop, (list, tuple)):
        raise ConfigError(
            f"stop = {stop!r}: a list of stopping criteria (StoppingCriterion objects, transformers StoppingCriteria, "
            "callables fn(ctx) -> (B,) bool); stop strings go in stop_strings="
        )
    return list(stop)


def strings_of(name: str, value: Any) -> list[Any]:
    """`stop_strings=` / `stop_regex=` as a list: one string, or a list of them (the criterion checks each)."""
    if value is None:
        return []
    if isinstance(value, str):
        return [value]
    if not isinstance(value, (list, tuple)):
        raise ConfigError(f"{name} = {value!r}: a string or a list of strings, e.g. {name}=['\\n\\n', 'User:']")
    return list(value)


def checked_params(params: Any) -> list[dict[str, Any]] | None:
    """`params=` as one dict per prompt's request, or None where one mapping (or none) is for all prompts."""
    if params is None or isinstance(params, Mapping):
        return None
    if isinstance(params, (list, tuple)):
        for i, p in enumerate(params):
            if p is not None and not isinstance(p, Mapping):
                raise ConfigError(
                    f"params[{i}] = {p!r}: a mapping of chain parameters for prompt {i} (e.g. {{'temperature': "
                    "0.7, 'seed': 1}) or None"
                )
        return [dict(p or {}) for p in params]
    raise ConfigError(
        f"params = {params!r}: one mapping for every prompt ({{'temperature': 0.7}}) or a list of one mapping (or "
        "None) per prompt"
    )


class _Processors(list):
    """A plain list of logits processors, run in order as model.generate runs one."""

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        for processor in self:
            scores = processor(input_ids, scores)
        return scores


def checked_processor(given: Any) -> Any:
    """`logits_processor=`: None, a callable fn(input_ids, scores) -> scores (a transformers LogitsProcessorList),
    or a list of them."""
    if given is None or (isinstance(given, (list, tuple)) and not given):
        return None
    if callable(given):
        return given
    if isinstance(given, (list, tuple)) and all(callable(p) for p in given):
        return _Processors(given)
    raise ConfigError(
        f"logits_processor = {given!r}: a callable fn(input_ids, scores) -> scores (a transformers LogitsProcessor "
        "or LogitsProcessorList), or a list of them"
    )


def checked_token_ids(name: str, value: Any, vocab: Any = None, *, one: bool = False) -> list[int]:
    """Token ids given as an int, a list or a tensor (`one`: a single int), each an integer >= 0 (and below `vocab`
    where given)."""
    items = value.flatten().tolist() if isinstance(value, torch.Tensor) else value
    if one and isinstance(value, torch.Tensor) and value.numel() == 1:
        items = items[0]
    listed = isinstance(items, (list, tuple))
    items = items if listed else [items]
    if one and not items:
        raise ConfigError(f"{name} = {value!r}: a token id of the model, not an empty list")
    for v in items:
        if (
            (one and listed)
            or isinstance(v, bool)
            or not isinstance(v, numbers.Integral)
            or not 0 <= int(v) < (vocab if isinstance(vocab, int) else 2**63)
        ):
            where = f"in [0, {vocab})" if isinstance(vocab, int) else ">= 0"
            what = "a token id of the model" if one else "a token id of the model or a list of them"
            raise ConfigError(f"{name} = {value!r}: {what} ({where})")
    return token_id_list(items)


class PromptInputs:
    """Generation's pad token, input rows, the positions they may grow to and its stopping criteria (the attributes
    are Generation's)."""

    model: Any
    tokenizer: Any
    generation_config: Any
    chain: Any
    eos_ids: list[int]
    pad_id: int
    _pad_note: str | None
    num_prompts: int
    n: int
    input_ids: torch.Tensor
    host: Any
    setup: Any
    stopping: Stopping
    _uncond_width: int

    def end_at_positions(self) -> None:
        """Rows that would run past the model's positions end at its last one (finish reason max_length), as
        llama.cpp ends a completion at its context: past them a model fails (learned position embeddings, a full
        KV cache) or degrades, and a failed step would lose every row's tokens. The positions are those of the
        wider context (a negative prompt's can be wider); a max_length past them gives way, with a warning. The
        decoding loops call it before their first step (score() checks its rows' positions itself); calling it
        again changes nothing."""
        limit = self.setup.max_positions
        bound = self.stopping.max_new_tokens(self.setup)
        width = max(self.setup.prompt_length, self._uncond_width)
        if limit is None or (bound is not None and width + bound <= limit):
            return
        n = limit - (width - self.setup.prompt_length)  # the conditional context's length when the wider one is full
        given = [c for c in self.stopping if c.name == "max_length"]
        if given:  # each gives more room than the positions (else the bound fits): the caller's to know
            warnings.warn(
                f"max_length = {given[0].params.n} runs past the model's {limit} positions: the rows end at the "
                f"last one (finish reason max_length); use max_length <= {n}",
                GenerationWarning,
                stacklevel=4,
            )
            self.stopping.criteria = [c for c in self.stopping.criteria if c.name != "max_length"]
        self.stopping.add(Stopping.criterion("max_length", {"n": n}, host=self.host))

    def _pad_id(self, explicit: int | None) -> int:
        if explicit is not None:
            return checked_token_ids(
                "pad_token_id", explicit, getattr(self.model.config, "vocab_size", None), one=True
            )[0]
        for src in (
            getattr(self.tokenizer, "pad_token_id", None),
            getattr(self.generation_config, "pad_token_id", None),
        ):
            if src is not None:
                return int(token_id_list(src)[0])
        if self.eos_ids:
            self._pad_note = (
                f"no pad token in the tokenizer or generation config: using eos id {self.eos_ids[0]} "
                "to pad prompts and finished rows (pass pad_token_id= to choose another)"
            )
            return self.eos_ids[0]
        self._pad_note = "no pad or eos token anywhere: padding with id 0 (pass pad_token_id= to choose another)"
        return 0

    def _inputs(self, prompts, input_ids, attention_mask, device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        if (prompts is None) == (input_ids is None):
            raise ConfigError("pass either prompts (with a tokenizer) or input_ids, not both and not neither")
        given: tuple[torch.Tensor, torch.Tensor] | None = None
        if prompts is not None:
            if self.tokenizer is None:
                raise ConfigError(
                    "prompts given as text or conversations need a tokenizer: generate(model, tokenizer, prompts)"
                )
            rows = [
                list((self.tokenizer(t, add_special_tokens=False) if chat else self.tokenizer(t))["input_ids"])
                for t, chat in prompt_texts(prompts, self.tokenizer)
            ]
        else:
            rows, given = _given_rows(input_ids, attention_mask, self._mask_from_padding)
        bos = getattr(self.tokenizer, "bos_token_id", None)
        if bos is None:
            bos = getattr(self.generation_config, "bos_token_id", None)
        for i, row in enumerate(rows):
            if not row:
                if bos is None:
                    raise ConfigError(
                        f"prompt {i} is empty and the model has no bos token to start from: give the "
                        "prompt at least one token"
                    )
                warnings.warn(
                    f"prompt {i} is empty: starting it from the bos token {bos}", GenerationWarning, stacklevel=5
                )
                row.append(int(bos))
        vocab = getattr(self.model.config, "vocab_size", None)
        for i, row in enumerate(rows):
            if isinstance(vocab, int) and (min(row) < 0 or max(row) >= vocab):
                bad = next(j for j, t in enumerate(row) if not 0 <= t < vocab)
                raise ConfigError(
                    f"prompt {i} has token id {row[bad]} at position {bad}: not a token of the model (its vocabulary "
                    f"is [0, {vocab})): pass ids from the model's own tokenizer"
                )
        limit = max_positions(self.model.config)
        for i, row in enumerate(rows):
            if limit is not None and len(row) >= limit:
                raise ConfigError(
                    f"prompt {i} has {len(row)} tokens but the model has {limit} positions, leaving no room to "
                    "generate: shorten the prompt (keep its last tokens)"
                )
        # input_ids keep their width, as transformers keeps it: sequences[:, input_ids.shape[1]:] are the new tokens
        # and max_length counts the padding, even where every row is padded
        ids, mask = _left_padded(rows, self.pad_id, 1 if given is None else given[0].shape[1])
        if given is not None and torch.equal(mask, given[1].to(mask.dtype)):
            ids = given[0].to(torch.int64, copy=True)  # plain left padding: the caller's pad ids stay too
        lengths = torch.tensor([len(r) for r in rows], dtype=torch.int64)
        return ids.to(device), mask.to(device), lengths

    def _mask_from_padding(self, ids: torch.Tensor) -> torch.Tensor:
        """No attention_mask: as transformers infers it, pad tokens are padding when the pad id is not an eos id
        (otherwise an eos inside a prompt could not be told from padding) and some row contains one."""
        pad = self.pad_id if self._pad_note is None else None  # an explicit or configured pad, not the fallback
        if pad is None or pad in self.eos_ids or not bool((ids == pad).any()):
            return torch.ones_like(ids)
        return (ids != pad).to(torch.int64)

    def _unconditional_inputs(self, text, ids, mask, device) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """The context of classifier-free guidance's second forward, one row per request, left-padded."""
        if not self.chain.needs_unconditional_logits:
            if text is not None or ids is not None:
                raise ConfigError(
                    "a negative prompt was given but the chain has no guidance sampler to use it: put "
                    '{ use = "cfg", scale = 1.5 } first in the chain'
                )
            return None, None
        if text is None and ids is None:
            texts = [
                getattr(s.params, "negative_prompt", "") for s in self.chain.samplers if s.needs_unconditional_logits()
            ]
            text = next((t for t in texts if t), None)
        if ids is not None:
            ids = torch.as_tensor(ids)
            ids = ids[None] if ids.ndim == 1 else ids
            mask = torch.ones_like(ids) if mask is None else torch.as_tensor(mask)
            if mask.shape != ids.shape:
                raise ConfigError(
                    f"negative_prompt_attention_mask shape {tuple(mask.shape)} differs from "
                    f"negative_prompt_ids shape {tuple(ids.shape)}"
                )
        elif text is not None:
            if self.tokenizer is None:
                raise ConfigError("a negative prompt given as text needs a tokenizer; or pass negative_prompt_ids")
            texts = [text] if isinstance(text, str) else list(text)
            rows = [list(self.tokenizer(t)["input_ids"]) or [self.pad_id] for t in texts]
            ids, mask = _left_padded(rows, self.pad_id)
        else:  # transformers without negative_prompt_ids: each row's last prompt token
            last = self.input_ids[:, -1:]
            return last.clone(), torch.ones_like(last)
        if ids.shape[0] not in (1, self.num_prompts):
            raise ConfigError(
                f"{ids.shape[0]} negative prompts for {self.num_prompts} prompts: give one, or one per prompt"
            )
        ids = ids.expand(self.num_prompts, -1) if ids.shape[0] == 1 else ids
        mask = mask.expand(self.num_prompts, -1) if mask.shape[0] == 1 else mask
        if self.n > 1:
            ids, mask = ids.repeat_interleave(self.n, dim=0), mask.repeat_interleave(self.n, dim=0)
        return ids.to(device=device, dtype=torch.int64).contiguous(), mask.to(device).contiguous()

    def _vocab_limit(self) -> int | None:
        """Logit columns past the tokenizer's vocabulary are tokens nobody can decode: they are masked."""
        if self.tokenizer is None:
            return None
        try:
            n = len(self.tokenizer)
        except TypeError:
            return None
        v = getattr(self.model.config, "vocab_size", None)
        if isinstance(v, int) and v > n:
            warnings.warn(
                f"the model has {v} logit columns but the tokenizer only {n} tokens: the extra "
                f"{v - n} columns are masked",
                GenerationWarning,
                stacklevel=4,
            )
            return n
        if isinstance(v, int) and v < n:
            warnings.warn(
                f"the tokenizer has {n} tokens but the model only {v} logit columns: tokens {v}..{n - 1} "
                "can never be generated (are they the right pair?)",
                GenerationWarning,
                stacklevel=4,
            )
        return None

    # ----------------------------------------------------------------- running

    def _include_rows(self, value: Any) -> list[bool]:
        """include_stop_str_in_output per row: one bool for every prompt, or one per prompt (vLLM sets it per
        request), repeated over the prompt's num_return_sequences."""
        flags = list(value) if isinstance(value, Sequence) else [value] * self.num_prompts
        if isinstance(value, str) or len(flags) != self.num_prompts or not all(map(is_flag, flags)):
            raise ConfigError(
                f"include_stop_str_in_output = {value!r}: give one bool, or a list of "
                f"{self.num_prompts} bools (one per prompt)"
            )
        return [bool(f) for f in flags for _ in range(self.n)]

    def _criterion(self, name: str, params: dict[str, Any]) -> Any:
        return Stopping.criterion(name, params, host=self.host)

    def _stopping(
        self, extra, max_new_tokens, max_length, max_time, stop_strings, ignore_eos, stop_regex=None
    ) -> Stopping:
        """The stopping criteria of generate()'s arguments, the chain's stop entries and the model's defaults."""
        entries = self.chain.stop_entries if isinstance(self.chain, MixedChains) else self.chain.config.stop
        stopping = Stopping.from_entries(entries, extra, require_length_limit=False)
        checked_flags(ignore_eos=ignore_eos)
        strings, patterns = strings_of("stop_strings", stop_strings), strings_of("stop_regex", stop_regex)
        if stop_strings:
            stopping.add(self._criterion("stop_strings", {"strings": strings}))
        if stop_regex:
            stopping.add(self._criterion("stop_regex", {"patterns": patterns}))
        if not ignore_eos and not stopping.has("eos"):
            if self.eos_ids:
                stopping.add(self._criterion("eos", {"ids": self.eos_ids}))
            else:
                warnings.warn(
                    "no eos token in the tokenizer, generation config or model config: rows stop only at "
                    "the length limit or another criterion",
                    GenerationWarning,
                    stacklevel=4,
                )
        if max_time is not None:
            if isinstance(max_time, bool) or not isinstance(max_time, numbers.Real):
                raise ConfigError(f"max_time = {max_time!r}: seconds, a number > 0")
            stopping.add(self._criterion("max_time", {"seconds": float(max_time)}))
        if max_new_tokens is not None:
            stopping.add(self._criterion("max_new_tokens", {"n": max_new_tokens}))
        if max_length is not None:
            stopping.add(self._criterion("max_length", {"n": max_length}))
        if not stopping.has_length_limit:  # transformers' defaults: generation config max_new_tokens / max_length
            gc = self.generation_config
            if getattr(gc, "max_new_tokens", None):
                stopping.add(self._criterion("max_new_tokens", {"n": int(gc.max_new_tokens)}))
            elif getattr(gc, "max_length", None):
                stopping.add(self._criterion("max_length", {"n": int(gc.max_length)}))
            else:  # transformers 5: 20 new tokens (within the model's positions: end_at_positions)
                stopping.add(self._criterion("max_new_tokens", {"n": 20}))
        return stopping


def _given_rows(
    input_ids: Any, attention_mask: Any, mask_from_padding: Any
) -> tuple[list[list[int]], tuple[torch.Tensor, torch.Tensor]]:
    """The rows of given input_ids (their unmasked tokens) and the (ids, mask) pair, checked: a (batch, length)
    integer tensor, a mask of its shape (from the padding when not given), left padding."""
    try:
        ids = torch.as_tensor(input_ids)
    except (TypeError, ValueError, RuntimeError, OverflowError):
        raise ConfigError(
            f"input_ids = {input_ids!r:.60}: a (batch, length) integer tensor or list of lists of token ids"
        ) from None
    if ids.ndim == 1:
        ids = ids[None]
    if ids.ndim != 2 or ids.dtype not in (torch.int64, torch.int32):
        raise ConfigError(f"input_ids must be a (batch, length) integer tensor, got {tuple(ids.shape)} {ids.dtype}")
    if attention_mask is None:
        mask = mask_from_padding(ids)
    else:
        try:
            mask = torch.as_tensor(attention_mask)
        except (TypeError, ValueError, RuntimeError, OverflowError):
            raise ConfigError(
                f"attention_mask = {attention_mask!r:.60}: a tensor of input_ids' shape, 1 for a token and 0 "
                "for padding"
            ) from None
    if mask.shape != ids.shape:
        raise ConfigError(f"attention_mask shape {tuple(mask.shape)} differs from input_ids shape {tuple(ids.shape)}")
    if ids.shape[0] > 1 and bool((mask[:, -1] == 0).any()):
        raise ConfigError(
            "input_ids are right-padded (attention_mask ends in 0 for some rows); decoder-only "
            "generation needs left padding: tokenizer.padding_side = 'left'"
        )
    rows = [[int(t) for t, m in zip(r, mr) if m] for r, mr in zip(ids.tolist(), mask.tolist())]
    return rows, (ids.cpu(), mask.cpu())  # on the host with the prompts built from them; the generation moves both


def _left_padded(rows: Sequence[Sequence[int]], pad_id: int, width: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """Prompt rows left-padded with `pad_id` to the longest row (or `width`), and their attention mask (0 on the
    padding): the mask is formed apart from the ids, as a prompt may contain the pad id itself."""
    return left_pad(rows, pad_id, width), left_pad([[1] * len(r) for r in rows], 0, width)


def prompt_texts(prompts: Any, tokenizer: Any, argument: str = "prompts") -> list[tuple[str, bool]]:
    """Each prompt of `prompts` as (text, is_chat): text as given, a conversation rendered with the tokenizer's chat
    template and the generation prompt. A chat text already holds the template's special tokens (its bos among
    them), so it is tokenized without adding them again. One ConfigError names `argument`, the culprit's index and
    the fix."""
    if isinstance(prompts, str):
        return [(prompts, False)]
    if isinstance(prompts, Mapping):
        raise ConfigError(
            f"{argument} is a single message: a conversation is a list of messages, "
            f'{argument}=[{{"role": "user", "content": "..."}}]'
        )
    if not _is_list(prompts):
        raise ConfigError(
            f"{argument} is a {type(prompts).__name__}: give text, a list of texts, a conversation (a list of "
            '{"role": ..., "content": ...} messages) or a list of conversations'
        )
    items = list(prompts)
    if not items:
        raise ConfigError(f"{argument} is an empty list: give at least one prompt")
    if all(isinstance(m, Mapping) for m in items):  # one conversation
        return [(render_chat(items, tokenizer, argument), True)]
    out: list[tuple[str, bool]] = []
    for i, item in enumerate(items):
        where = f"{argument}[{i}]"
        if isinstance(item, str):
            out.append((item, False))
        elif isinstance(item, Mapping):
            raise ConfigError(
                f"{where} is a message but other items of {argument} are not: give one conversation (a list of "
                "messages only) or a batch (a list of texts and conversations, each conversation a list)"
            )
        elif _is_list(item):
            out.append((render_chat(item, tokenizer, where), True))
        else:
            raise ConfigError(
                f"{where} is a {type(item).__name__}: each prompt is text or a conversation (a list of "
                '{"role": ..., "content": ...} messages); pass token ids as input_ids='
            )
    return out


def chat_template_of(tokenizer: Any, argument: str = "prompts") -> str:
    """The tokenizer's chat template, or a ConfigError saying how to give one."""
    template = getattr(tokenizer, "chat_template", None)
    if not template or not callable(getattr(tokenizer, "apply_chat_template", None)):
        raise ConfigError(
            f"{argument}: the tokenizer has no chat template to render a conversation with: use a chat model (an "
            "instruct model's tokenizer has one), set tokenizer.chat_template to a Jinja template, or give the "
            "prompt as text"
        )
    return template if isinstance(template, str) else str(template)


def render_chat(conversation: Any, tokenizer: Any, where: str) -> str:
    """A conversation checked message by message and rendered with the tokenizer's chat template, ending in the
    generation prompt (the assistant's turn opened)."""
    if not _is_list(conversation):
        raise ConfigError(
            f"{where} is a {type(conversation).__name__}, not a conversation: give a list of "
            '{"role": ..., "content": ...} messages'
        )
    messages = list(conversation)
    if not messages:
        raise ConfigError(f"{where} is an empty conversation: give at least one message, e.g. a user message")
    for j, message in enumerate(messages):
        _check_message(message, f"{where}[{j}]")
    chat_template_of(tokenizer, where)
    try:
        text = tokenizer.apply_chat_template([dict(m) for m in messages], add_generation_prompt=True, tokenize=False)
    except Exception as exc:  # noqa: BLE001 - a template's own checks (raise_exception) fail as jinja errors
        raise ConfigError(
            f"{where}: the tokenizer's chat template refused the conversation ({type(exc).__name__}: {exc}); "
            "check the roles and their order the model expects"
        ) from None
    if not isinstance(text, str):
        raise ConfigError(f"{where}: the tokenizer's chat template gave {type(text).__name__}, not text")
    return text


def _check_message(message: Any, where: str) -> None:
    example = '{"role": "user", "content": "..."}'
    if not isinstance(message, Mapping):
        raise ConfigError(f"{where} is a {type(message).__name__}, not a message: give a dict like {example}")
    missing = [key for key in ("role", "content") if key not in message]
    if missing:
        raise ConfigError(f"{where} has no {' and no '.join(map(repr, missing))}: a message is {example}")
    for key in ("role", "content"):
        if not isinstance(message[key], str):
            raise ConfigError(
                f"{where}[{key!r}] is a {type(message[key]).__name__}: the {key} of a message is text, as in {example}"
            )


def _is_list(value: Any) -> bool:
    """A sequence of items (a list or tuple), not text or bytes."""
    return isinstance(value, Sequence) and not isinstance(value, (str, bytes, bytearray))
