"""`suffix`: Suffix Decoding, a drafter that a third party adds to samplechain without touching its core.

Suffix Decoding (Oliaro et al., "SuffixDecoding: Extreme Speculative Decoding for Emerging AI Applications",
arXiv:2411.04975; vLLM's `method = "suffix"`, through Arctic Inference) drafts from two suffix trees of at most
`max_depth` tokens per path: one over the row's own prompt and text so far, and one over the answers rows have
written, this generation's as they are written and those of the generations before it in the process (at most
`max_cached_requests` answers, the oldest dropped first). Agent loops, self-refinement, several samples of one prompt and RL rollouts write much of what an earlier
answer wrote; a lookup of the row's own text cannot see that.

For each match length m = 1, 2, ... below the pattern's length (the pattern: the row's last `max_depth` tokens), while
the row's last m tokens occur in a tree, the draft follows the most frequent continuation, token by token: the
child with the largest count (ties: the smallest token id), its estimated probability the product of count(child) /
count(node) along the path; it stops at `min(limit, floor(m * max_spec_factor + max_spec_offset))` tokens or where
the probability falls below `min_token_prob`. Each draft scores the sum of its tokens' probabilities; the best
scoring one wins (a longer match on a tie), and an earlier answers' draft replaces the row's own only with a higher
score. A node's count is the number of times its path occurs (paths of at most `max_depth` tokens), as in Arctic
Inference's trees.

The drafter changes no token: the generation keeps a drafted token only where the chain draws it.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from typing import Any

import attrs
import torch

from samplechain import finite, hookimpl, in_range
from samplechain.drafters import DraftContext, Drafter

__all__ = ["SuffixDecoding", "SuffixParams", "SuffixTree", "clear_answers"]


@attrs.frozen
class SuffixParams:
    num_tokens: int = attrs.field(default=32, validator=in_range(1, None, hint="the longest draft"))
    max_depth: int = attrs.field(default=24, validator=in_range(2, None, hint="the longest path the trees hold"))
    max_spec_factor: float = attrs.field(default=1.0, validator=[finite, in_range(0.0, None)])
    max_spec_offset: float = attrs.field(default=0.0, validator=finite)
    min_token_prob: float = attrs.field(default=0.1, validator=[finite, in_range(0.0, 1.0)])
    max_cached_requests: int = attrs.field(
        default=10000, validator=in_range(0, None, hint="earlier answers kept; 0 keeps none")
    )


class _Node:
    """A run of tokens that every path through it takes whole, `count` the times its paths occur, `children` keyed
    by their first token."""

    __slots__ = ("children", "count", "run")

    def __init__(self, run: list[int], count: int) -> None:
        self.run, self.count = run, count
        self.children: dict[int, _Node] = {}


class SuffixTree:
    """The paths of at most `depth` tokens of a set of token sequences, each counting how often it occurs; a run
    that one occurrence alone takes is one node (a suffix tree's compression, as Arctic Inference's), so the tree
    holds about two nodes per token. Sequences grow token by token (`extend`) and leave whole (`remove`)."""

    def __init__(self, depth: int) -> None:
        self.depth = depth
        self.root = _Node([], 0)
        self.seqs: dict[int, list[int]] = {}
        self._ends: dict[int, deque[_Node]] = {}  # per sequence: the nodes its suffixes below `depth` end at

    def extend(self, seq: int, tokens: Sequence[int]) -> None:
        held = self.seqs.setdefault(seq, [])
        ends = self._ends.setdefault(seq, deque())
        root = self.root
        for token in tokens:
            held.append(token)
            ends.append(root)  # the suffix that starts at this token
            root.count += 1
            if len(ends) > self.depth:
                ends.popleft()  # a path of `depth` tokens goes no deeper
            for i, node in enumerate(ends):
                # every suffix ends at the last token of its node's run
                child = node.children.get(token)
                if child is None:
                    if node.count == 1 and node is not root:  # only this suffix came here: its run grows
                        node.run.append(token)
                        continue
                    child = node.children[token] = _Node([token], 1)
                elif len(child.run) == 1:
                    child.count += 1
                else:  # the child's first token becomes a node of its own; the rest keeps its object
                    upper = _Node([token], child.count + 1)
                    del child.run[0]
                    upper.children[child.run[0]] = child
                    child = node.children[token] = upper
                ends[i] = child

    def remove(self, seq: int) -> None:
        """Every suffix of the sequence leaves the counts: a node no path takes any more leaves the tree, and a node
        that every path through it leaves by its one child joins that child's run (the child keeps its object, which
        other sequences' ends may hold)."""
        held = self.seqs.pop(seq, None)
        self._ends.pop(seq, None)
        if held is None:
            return
        for start in range(len(held)):
            node = self.root
            node.count -= 1
            passed: list[tuple[_Node, _Node]] = []  # (parent, node) along the suffix
            at, stop = start, min(len(held), start + self.depth)
            while at < stop:  # the suffix takes whole runs: it ended at one's last token
                child = node.children[held[at]]
                child.count -= 1
                if child.count == 0:
                    del node.children[held[at]]
                    break
                passed.append((node, child))
                at += len(child.run)
                node = child
            for parent, node in reversed(passed):
                if len(node.children) == 1:
                    (only,) = node.children.values()
                    if only.count == node.count:
                        only.run[:0] = node.run
                        parent.children[node.run[0]] = only

    def _find(self, path: Sequence[int]) -> tuple[_Node, int] | None:
        """The node `path` ends in and how many of its run's tokens it takes, or None where it does not occur."""
        node, taken = self.root, 0
        for token in path:
            if taken < len(node.run):
                if node.run[taken] != token:
                    return None
                taken += 1
                continue
            child = node.children.get(token)
            if child is None:
                return None
            node, taken = child, 1
        return node, taken

    def speculate(
        self, pattern: Sequence[int], limit: int, factor: float, offset: float, min_prob: float
    ) -> tuple[list[int], float]:
        """The best-scoring draft after `pattern` (its tokens and score; see the module's docstring)."""
        best: list[int] = []
        best_score = 0.0
        for m in range(1, len(pattern)):
            found = self._find(pattern[len(pattern) - m :])
            if found is None:
                break  # a longer suffix of the pattern occurs nowhere either
            cap = min(limit, max(0, int(m * factor + offset + 1e-6)))
            draft, score = _path(*found, cap, min_prob)
            if score >= best_score:
                best, best_score = draft, score
        return best, best_score


def _path(node: _Node, taken: int, limit: int, min_prob: float) -> tuple[list[int], float]:
    """The most frequent continuation past `taken` tokens of `node`'s run: at most `limit` tokens, each of estimated
    probability at least `min_prob`; with the sum of their probabilities."""
    draft: list[int] = []
    prob, score = 1.0, 0.0
    while len(draft) < limit:
        if taken < len(node.run):
            draft.append(node.run[taken])
            score += prob
            taken += 1
            continue
        if not node.children:
            break
        token, child = max(node.children.items(), key=lambda item: (item[1].count, -item[0]))
        prob *= child.count / node.count
        if prob < min_prob:
            break
        node, taken = child, 0
    return draft, score


class _Answers:
    """Earlier rows' answers in one tree (its sequences, oldest first), the oldest leaving first beyond the most
    kept."""

    def __init__(self, depth: int) -> None:
        self.tree = SuffixTree(depth)
        self.next_id = 0

    def begin(self, keep: int, tokens: Sequence[int]) -> int | None:
        """A new answer of `tokens` so far, or None where none are kept."""
        if keep == 0:
            return None
        seq, self.next_id = self.next_id, self.next_id + 1
        self.tree.extend(seq, tokens)
        while len(self.tree.seqs) > keep:
            self.tree.remove(next(iter(self.tree.seqs)))
        return seq

    def extend(self, seq: int | None, tokens: Sequence[int]) -> None:
        if seq is not None and seq in self.tree.seqs:  # an answer dropped while its row goes on gathers no more
            self.tree.extend(seq, tokens)

    def forget(self, seq: int | None) -> None:
        if seq is not None:
            self.tree.remove(seq)


# per tokenizer, vocabulary width and depth: the answers of every generation of the process
_ANSWERS: dict[tuple[Any, ...], _Answers] = {}


def clear_answers() -> None:
    """Forget every earlier answer (of every tokenizer)."""
    _ANSWERS.clear()


@attrs.define
class _Row:
    tree: SuffixTree
    seen: list[int]  # the tokens the row's tree holds
    start: int  # where the row's answer begins in them (its tokens at its first draft)
    answer: int | None  # the answer's sequence among the earlier answers


class SuffixDecoding(Drafter):
    name = "suffix"
    Params = SuffixParams
    summary = "drafter: Suffix Decoding, the most frequent continuation in the row's text and earlier answers"

    def __init__(self, params: SuffixParams | None = None) -> None:
        super().__init__(params)
        self._rows: dict[int, _Row] = {}
        self._answers = _Answers(self.params.max_depth)

    def start(self, rows: int, context: DraftContext) -> None:
        tok = context.tokenizer
        key = (type(tok).__name__, getattr(tok, "name_or_path", None), context.vocab_size, self.params.max_depth)
        self._answers = _ANSWERS.setdefault(key, _Answers(self.params.max_depth))
        self._rows = {}

    def propose(self, row: int, tokens: torch.Tensor, limit: int) -> list[int]:
        p = self.params
        seen = tokens.tolist()
        r = self._follow(row, seen)
        pattern = seen[-p.max_depth :]
        cap = min(p.num_tokens, limit)
        args = (cap, p.max_spec_factor, p.max_spec_offset, p.min_token_prob)
        draft, score = r.tree.speculate(pattern, *args)
        if p.max_cached_requests:
            theirs, their_score = self._answers.tree.speculate(pattern, *args)
            if their_score > score:
                draft = theirs
        return draft

    def _follow(self, row: int, seen: list[int]) -> _Row:
        """Row `row`'s state brought up to its tokens `seen`: what came since is added to both trees. At its first
        draft, and where tokens were taken back (a guard's rewind), its tree is built and its answer begun again."""
        r = self._rows.get(row)
        if r is not None and seen[: len(r.seen)] == r.seen:
            new = seen[len(r.seen) :]
            r.tree.extend(0, new)
            self._answers.extend(r.answer, new)
            r.seen = seen
            return r
        tree = SuffixTree(self.params.max_depth)
        tree.extend(0, seen)
        start = len(seen) if r is None else min(r.start, len(seen))
        if r is not None:
            self._answers.forget(r.answer)
        answer = self._answers.begin(self.params.max_cached_requests, seen[start:])
        r = self._rows[row] = _Row(tree, seen, start, answer)
        return r

    def finish(self, rows: Sequence[int]) -> None:
        for row in rows:  # the answer stays among the earlier answers
            self._rows.pop(row, None)


@hookimpl
def register_drafters(register):
    register(SuffixDecoding)
