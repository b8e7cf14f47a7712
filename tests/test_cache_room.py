"""The transformers runner's cache layers append in place (generation/cache_room.py): every pass reads bit for bit
what transformers' concatenating DynamicLayer gives, across the room running out, cut-backs, holes, released rows,
beam reordering and passes taken back."""

from __future__ import annotations

import contextlib

import pytest
import torch

from samplechain.generation import TransformersRunner, cache_room
from samplechain.models import tiny_model_path

transformers = pytest.importorskip("transformers")
DynamicLayer, RoomyLayer = cache_room.dynamic_layers()


@pytest.fixture(scope="module")
def tiny():
    return transformers.AutoModelForCausalLM.from_pretrained(tiny_model_path()).eval()


def _pair(model, ids, mask=None):
    """Two runners on the same prompt: one whose layers append in place, one on transformers' own layers."""
    roomy, plain = TransformersRunner(model, ids, mask), TransformersRunner(model, ids, mask)
    plain.room = False
    return roomy, plain


def _layers(runner):
    return runner.kwargs[runner.cache_key].layers


def test_passes_read_what_concatenation_gives_across_cut_backs_holes_and_the_room_running_out(tiny, monkeypatch):
    monkeypatch.setattr(cache_room, "ROOM", 8)  # the room runs out every few passes
    ids = torch.tensor([[0, 0, 12, 13], [21, 22, 23, 24], [0, 31, 32, 33]])
    mask = (ids != 0).long()
    roomy, plain = _pair(tiny, ids, mask)
    assert torch.equal(roomy.prefill(), plain.prefill())
    assert {type(layer) for layer in _layers(roomy)} == {RoomyLayer}
    assert {type(layer) for layer in _layers(plain)} == {DynamicLayer}
    seq = ids
    grown = set()
    for step in range(30):
        seq = torch.cat([seq, torch.full((3, 1), 40 + step)], dim=-1)
        room = _layers(roomy)[0].key_room
        assert torch.equal(roomy.step(seq), plain.step(seq)), step
        keys = _layers(roomy)[0].keys
        assert keys.data_ptr() == _layers(roomy)[0].key_room.data_ptr()  # the front of its room
        grown.add(room is None or _layers(roomy)[0].key_room is not room)
        if step % 7 == 6:  # a check of three rows' drafts, holes in two, then cut back to what each keeps
            feeds = [torch.tensor([5, 6, 7]), torch.tensor([8]), torch.tensor([9, 10])]
            for a, b in zip(roomy.extend_rows([0, 1, 2], feeds), plain.extend_rows([0, 1, 2], feeds)):
                assert torch.equal(a, b)
            held = [len(roomy.holds(r)) for r in range(3)]
            keep = [held[0] - 1, held[1], held[2] - 2]
            roomy.truncate(keep), plain.truncate(keep)  # a step feeds each row's last column of `seq`
        assert torch.equal(_layers(roomy)[1].keys, _layers(plain)[1].keys)
        assert torch.equal(_layers(roomy)[1].values, _layers(plain)[1].values)
    assert grown == {True, False}  # most passes wrote in place, some made new room


def test_released_rows_and_beam_reordering_leave_the_passes_as_they_were(tiny):
    ids = torch.tensor([[11, 12, 13, 14], [21, 22, 23, 24], [31, 32, 33, 34]])
    roomy, plain = _pair(tiny, ids)
    roomy.prefill(), plain.prefill()
    feeds = [torch.tensor([5]), torch.tensor([6]), torch.tensor([7])]
    roomy.extend_rows([0, 1, 2], feeds), plain.extend_rows([0, 1, 2], feeds)
    roomy.reorder(torch.tensor([2, 0, 0])), plain.reorder(torch.tensor([2, 0, 0]))
    for a, b in zip(roomy.extend_rows([0, 1, 2], feeds), plain.extend_rows([0, 1, 2], feeds)):
        assert torch.equal(a, b)
    roomy.release([1]), plain.release([1])
    for _ in range(3):
        got = roomy.extend_rows([0, 2], [torch.tensor([8, 9]), torch.tensor([3])])
        want = plain.extend_rows([0, 2], [torch.tensor([8, 9]), torch.tensor([3])])
        assert all(torch.equal(a, b) for a, b in zip(got, want))


def test_a_pass_taken_back_leaves_the_keys_it_kept_unwritten(tiny):
    """Inside lookahead() the cache is cut back below what the block started with and fed again: the writes go to
    new room, so the keys and values kept for the block are those put back, and the next pass reads what a runner
    that never looked ahead reads."""
    ids = torch.tensor([[11, 12, 13, 14], [21, 22, 23, 24]])
    roomy, plain = _pair(tiny, ids)
    roomy.prefill(), plain.prefill()
    feeds = [torch.tensor([7, 8]), torch.tensor([9])]
    roomy.extend_rows([0, 1], feeds), plain.extend_rows([0, 1], feeds)
    layer = _layers(roomy)[0]
    before = layer.keys.clone(), layer.values.clone()
    for fail in (False, True):
        with contextlib.suppress(RuntimeError), roomy.lookahead():
            assert layer.floor == before[0].shape[-2]
            roomy.extend_rows([1], [torch.tensor([3])])  # in place, past the kept keys
            roomy.truncate([4, 4])  # below the keys kept for the block
            roomy.extend_rows([0, 1], [torch.tensor([1, 2, 3]), torch.tensor([4, 5])])
            if fail:
                raise RuntimeError("a drafter's pass fails")
        assert layer.floor == 0
        assert torch.equal(layer.keys, before[0]) and torch.equal(layer.values, before[1])
    nxt = [torch.tensor([1]), torch.tensor([2])]
    for a, b in zip(roomy.extend_rows([0, 1], nxt), plain.extend_rows([0, 1], nxt)):
        assert torch.equal(a, b)


def test_appending_writes_in_place_while_the_room_lasts_and_above_the_floor():
    held = torch.randn(2, 3, 5, 4)
    new = torch.randn(2, 3, 2, 4)
    keys, room = cache_room._appended(held, new, None, 0)  # a tensor of transformers': copied into new room
    assert room.shape[-2] == 7 + cache_room.ROOM and torch.equal(keys, torch.cat([held, new], dim=-2))
    more = torch.randn(2, 3, 1, 4)
    again, same = cache_room._appended(keys, more, room, 0)
    assert same is room and again.data_ptr() == room.data_ptr()
    assert torch.equal(again, torch.cat([held, new, more], dim=-2))
    cut = again[..., :6, :]  # cut back below a floor of 7: new room, the old one untouched
    after, other = cache_room._appended(cut, more, room, 7)
    assert other is not room and torch.equal(after, torch.cat([cut, more], dim=-2))
    assert torch.equal(room[..., :8, :], torch.cat([held, new, more], dim=-2))
    wider = torch.randn(3, 3, 1, 4)  # rows released or reordered: another batch, new room
    assert cache_room._appended(torch.randn(3, 3, 8, 4), wider, room, 0)[1] is not room


def test_room_made_in_inference_mode_is_left_for_new_room_outside_it():
    held = torch.randn(1, 2, 3, 4)
    with torch.inference_mode():
        keys, room = cache_room._appended(held, torch.randn(1, 2, 1, 4), None, 0)
    new = torch.randn(1, 2, 1, 4)
    after, other = cache_room._appended(keys, new, room, 0)  # outside: writing into `room` would raise
    assert other is not room and not other.is_inference() and torch.equal(after, torch.cat([keys, new], dim=-2))
