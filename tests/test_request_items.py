"""``caches.items.RequestItems``: requests' cache items as columns read back as the lists they
stand for (the order band and merge-runs' prediction read them so)."""
from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from mmdatagen.caches.items import RequestItems

KEYS = st.one_of(st.integers(0, 5), st.sampled_from(["a", "b", ("set", 1, 2)]))
ITEMS = st.lists(st.lists(st.tuples(KEYS, st.integers(0, 9)), max_size=4), max_size=12)


@settings(max_examples=300, deadline=None)
@given(items=ITEMS, data=st.data())
def test_columns_read_back_as_their_lists(items, data):
    """Indexing, iteration, ``take``, ``refs``, ``apart`` and ``owner`` give what the item lists
    give; equal keys share one id, in order of first appearance."""
    cols = RequestItems.of(items)
    assert len(cols) == len(items)
    assert [cols[p] for p in range(len(items))] == items == list(cols)
    assert [cols[p] for p in range(-len(items), 0)] == items
    assert list(cols[1:3]) == items[1:3]
    flat = [k for it in items for k, _ in it]
    assert [cols.name(k) for k in cols.key.tolist()] == flat
    assert cols.num_keys == len(dict.fromkeys(flat))
    assert cols.owner.tolist() == [p for p, it in enumerate(items) for _ in it]
    rows = data.draw(st.lists(st.integers(0, max(len(items) - 1, 0)), max_size=8)
                     if items else st.just([]))
    assert list(cols.take(np.array(rows, np.int64))) == [items[r] for r in rows]
    at = cols.refs(np.array(rows, np.int64)).tolist()
    assert [(cols.name(cols.key[i]), int(cols.size[i])) for i in at] == [
        x for r in rows for x in items[r]]
    split, owner = cols.apart()
    assert list(split) == [part for it in items for part in ([[x] for x in it] or [[]])]
    assert owner.tolist() == [p for p, it in enumerate(items) for _ in (it or [None])]


@settings(max_examples=200, deadline=None)
@given(parts=st.lists(st.lists(st.lists(st.tuples(st.integers(0, 6), st.integers(1, 9)),
                                        max_size=3), max_size=5), max_size=4))
def test_concat_is_the_requests_one_after_the_other(parts):
    """Parts whose key ids are shared (integer keys used as their ids) concatenate to the
    columns of all their requests."""
    def columns(items):
        start = np.zeros(len(items) + 1, np.int64)
        np.cumsum([len(it) for it in items], out=start[1:])
        return RequestItems(start, np.array([k for it in items for k, _ in it], np.int64),
                            np.array([s for it in items for _, s in it], np.int64))

    whole = RequestItems.concat([columns(p) for p in parts])
    assert list(whole) == [it for p in parts for it in p]
