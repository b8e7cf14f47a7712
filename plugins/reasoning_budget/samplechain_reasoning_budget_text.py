"""What `reasoning_budget` reads of the decoded text, as per-token tables built once per vocabulary on the string
service's byte table (`samplechain.strings`): where the text so far stands in a UTF-8 character, and whether it is
inside an open span (a code fence, a tool call).

Both are automata over the text's bytes folded into (V, S) tables: for token v and the automaton's state s before
it, the state after its bytes. A marker split over several tokens is therefore seen, whatever the split; a token
without bytes (a special token) leaves the state as it was.

Spans: scanning the text left to right, outside every span the first opening marker to complete (of two completing
on the same byte, the longer) opens its span; inside a span only that span's closing marker is looked for, and it
closes the span. The scan goes on after each marker, so a marker never overlaps the one before it. A code fence is
the span ("```", "```").
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence
from typing import Any

import torch

from samplechain.strings import ByteTable, byte_table

_UTF8: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # strings.ByteTable -> its utf8_table


def utf8_table(tokenizer: Any) -> torch.Tensor:
    """(V, 4) int64: for token v and n continuation bytes still awaited before it, how many are awaited after its
    bytes. A lead byte awaits 1-3, a continuation byte settles one, anything else (ASCII, a stray continuation, a
    broken sequence) awaits none; a token without bytes (special) leaves the count as it was."""
    table = byte_table(tokenizer)
    if table in _UTF8:  # one per distinct vocabulary, as the byte table itself
        return _UTF8[table]
    data, lengths = table.bytes.long(), table.lengths
    need = torch.arange(4).expand(data.shape[0], 4).clone()  # (V, 4): column n starts awaiting n
    for j in range(data.shape[1]):  # the byte columns, vectorised over the vocabulary
        b = data[:, j : j + 1]
        after = torch.where(
            (b & 0xC0) == 0x80,
            (need - 1).clamp(min=0),
            torch.where(
                (b & 0xE0) == 0xC0, 1, torch.where((b & 0xF0) == 0xE0, 2, torch.where((b & 0xF8) == 0xF0, 3, 0))
            ),
        )
        need = torch.where((j < lengths)[:, None], after, need)
    _UTF8[table] = need
    return need


def _trie(patterns: Sequence[bytes]) -> tuple[list[list[int]], list[int]]:
    """Aho-Corasick over `patterns`: the full goto table (node x byte -> node) and, per node, the pattern that
    completes there (the longest one ending at it, through the suffix links), -1 for none."""
    children: list[dict[int, int]] = [{}]
    ends = [-1]
    for k, pattern in enumerate(patterns):
        node = 0
        for b in pattern:
            if b not in children[node]:
                children[node][b] = len(children)
                children.append({})
                ends.append(-1)
            node = children[node][b]
        if ends[node] < 0:
            ends[node] = k
    goto = [[0] * 256 for _ in children]
    fail = [0] * len(children)
    order = []
    for b, first in children[0].items():
        goto[0][b] = first
        order.append(first)
    for node in order:  # breadth first: a node's suffix link is settled before its children's
        if ends[node] < 0:
            ends[node] = ends[fail[node]]
        for b in range(256):
            child = children[node].get(b)
            if child is None:
                goto[node][b] = goto[fail[node]][b]
            else:
                fail[child] = goto[fail[node]][b] if node else 0
                goto[node][b] = child
                order.append(child)
    return goto, ends


def span_automaton(spans: Sequence[tuple[str, str]]) -> tuple[torch.Tensor, torch.Tensor]:
    """The byte automaton of the spans: (S, 256) int64 state x byte -> state, and (S,) int64 the span each state is
    inside (0 outside every span, k + 1 inside spans[k]). State 0 is outside, at the start of a marker."""
    regions = [[s[0].encode() for s in spans]] + [[s[1].encode()] for s in spans]
    tries = [_trie(patterns) for patterns in regions]
    offsets = [0]
    for goto, _ in tries:
        offsets.append(offsets[-1] + len(goto))
    trans, region_of = [], []
    for r, (goto, ends) in enumerate(tries):
        for node in range(len(goto)):
            row = []
            for b in range(256):
                nxt = goto[node][b]
                k = ends[nxt]
                target = (k + 1 if r == 0 else 0) if k >= 0 else None
                row.append(offsets[target] if target is not None else offsets[r] + nxt)
            trans.append(row)
            region_of.append(r)
    return torch.tensor(trans, dtype=torch.int64), torch.tensor(region_of, dtype=torch.int64)


def span_table(tokenizer: Any, spans: Sequence[tuple[str, str]]) -> tuple[torch.Tensor, torch.Tensor]:
    """((V, S) int64 token x state before -> state after its bytes, (S,) int64 the span of each state), cached on
    the vocabulary's byte table per set of spans."""
    table: ByteTable = byte_table(tokenizer)
    key = ("reasoning_budget.spans", tuple(tuple(s) for s in spans))
    if key not in table.derived:
        trans, region_of = span_automaton(spans)
        states = trans.shape[0]
        flat = trans.reshape(-1)
        data, lengths = table.bytes.long(), table.lengths
        after = torch.arange(states).repeat(data.shape[0], 1)  # (V, S): before any byte, the state is unchanged
        for j in range(data.shape[1]):  # byte column j of the tokens that have one
            rows = (lengths > j).nonzero().flatten()
            if rows.numel() == 0:
                break
            after[rows] = flat[after[rows] * 256 + data[rows, j : j + 1]]
        table.derived[key] = (after, region_of)
    return table.derived[key]
