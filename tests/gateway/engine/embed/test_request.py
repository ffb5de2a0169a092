"""The embedding call's messages (engine/embed/request.py): a refusal crosses the engine
pipe (a pickle) with its index and field; an item is exactly one kind; equal content has
one content key and any difference (text, ids, a part's order, an image's pixels) another.
"""

from __future__ import annotations

import pickle

import pytest

from gateway.engine.embed.request import EmbedImage, EmbedItem, EmbedRefused


def test_refusal_crosses_a_pickle_whole() -> None:
    back = pickle.loads(pickle.dumps(EmbedRefused("too long", 3, "input")))
    assert isinstance(back, EmbedRefused)
    assert (str(back), back.index, back.field) == ("too long", 3, "input")


def test_an_item_is_exactly_one_kind() -> None:
    with pytest.raises(ValueError):
        EmbedItem(text="a", ids=(1,))
    with pytest.raises(ValueError):
        EmbedItem()


def test_content_keys() -> None:
    a = EmbedImage(None, "pixels-a", 4, 4)
    a_again = EmbedImage(object(), "pixels-a", 4, 4)  # other object, same pixels
    b = EmbedImage(None, "pixels-b", 4, 4)
    assert EmbedItem(parts=("x", a)).content_key() == EmbedItem(parts=("x", a_again)).content_key()
    keys = {
        EmbedItem(text="x").content_key(),
        EmbedItem(text="y").content_key(),
        EmbedItem(ids=(1, 2)).content_key(),
        EmbedItem(parts=("x",)).content_key(),
        EmbedItem(parts=("x", a)).content_key(),
        EmbedItem(parts=(a, "x")).content_key(),
        EmbedItem(parts=("x", b)).content_key(),
    }
    assert len(keys) == 7


def test_an_answer_for_a_cancelled_call_is_dropped_quietly() -> None:
    """Invariant: settling a future its waiter cancelled (a request cancelled at shutdown)
    neither raises on the delivering thread nor changes the future."""
    from concurrent.futures import Future

    from gateway.engine.embed.request import settle

    for outcome in ("a result", RuntimeError("a failure")):
        future: Future[object] = Future()
        assert future.cancel()
        settle(future, outcome)
        assert future.cancelled()
    done: Future[object] = Future()
    settle(done, "first")
    settle(done, "second")  # settled already: the first answer stays
    assert done.result() == "first"
