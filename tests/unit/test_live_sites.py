"""The time window of a track() block (cudatrace/analyze/documents/live_sites.py): which allocations were
live at the block's own peak, and which at its end."""

from __future__ import annotations

from types import SimpleNamespace

from cudatrace.analyze.documents.live_sites import window_allocs


def A(name, ts, size, end=None):
    return SimpleNamespace(name=name, ts=ts, size=size, end_ts=end)


def names(allocs):
    return sorted(a.name for a in allocs)


def test_peak_is_the_blocks_own_highest_moment():
    allocs = [
        A("before", 5, 100),  # made before the block: never the block's
        A("a", 10, 4, end=30),
        A("b", 20, 2),
        A("c", 25, 1, end=26),  # at 25: a+b+c = 7, the block's peak
        A("d", 40, 3),  # at 40: b+d = 5
        A("after", 60, 50),  # after the block
    ]
    assert names(window_allocs(allocs, 10, 50, "peak")) == ["a", "b", "c"]
    assert names(window_allocs(allocs, 10, 50, "end")) == ["b", "d"]
    assert names(window_allocs(allocs, 26, 50, "peak")) == ["d"]


def test_a_free_and_an_allocation_at_the_same_time():
    # the free comes first: 4 freed and 3 made at t=20 never live together
    allocs = [A("a", 10, 4, end=20), A("b", 20, 3)]
    assert names(window_allocs(allocs, 0, 30, "peak")) == ["a"]
    # freed after the block's end: still live at its end
    assert names(window_allocs([A("x", 10, 1, end=40)], 0, 30, "end")) == ["x"]


def test_nothing_in_the_window():
    assert window_allocs([A("a", 1, 5)], 10, 20, "peak") == []
    assert window_allocs([], 0, 1, "end") == []
