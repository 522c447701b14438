from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from parlab.topology import Topology


def test_megatron_example_groups() -> None:
    t = Topology(world_size=16, pp=2, dp=2, tp=4)
    assert t.groups("tp") == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11], [12, 13, 14, 15]]
    assert t.groups("dp")[:2] == [[0, 4], [1, 5]]
    assert t.groups("pp")[0] == [0, 8]
    assert t.coords(13) == {"pp": 1, "dp": 1, "cp": 0, "tp": 1, "ep": 0}


@given(
    st.sampled_from([1, 2, 4]),
    st.sampled_from([1, 2, 3]),
    st.sampled_from([1, 2]),
    st.sampled_from([1, 2, 4]),
)
def test_coords_and_groups_partition_the_world(pp: int, dp: int, cp: int, tp: int) -> None:
    t = Topology.from_degrees(pp=pp, dp=dp, cp=cp, tp=tp)
    assert sorted(t.rank_of(**t.coords(r)) for r in range(t.world_size)) == list(
        range(t.world_size)
    )
    for axis in ("pp", "dp", "cp", "tp"):
        groups = t.groups(axis)
        assert sorted(itertools.chain(*groups)) == list(range(t.world_size))
        assert all(len(g) == getattr(t, axis) for g in groups)
        for g in groups:  # members differ only along the axis
            others = [{k: v for k, v in t.coords(r).items() if k not in (axis, "ep")} for r in g]
            assert all(o == others[0] for o in others)


def test_ep_splits_dp() -> None:
    t = Topology(world_size=8, dp=8, ep=4)
    assert t.groups("ep") == [[0, 1, 2, 3], [4, 5, 6, 7]]
    with pytest.raises(ValueError, match="ep = 3 does not divide dp = 8"):
        Topology(world_size=8, dp=8, ep=3)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(world_size=8, dp=2, tp=2), "not the world size 8"),
        (dict(world_size=0), "at least 1"),
        (dict(world_size=16, tp=16, gpus_per_node=8), "keep TP within a node"),
    ],
)
def test_bad_topologies(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Topology(**kwargs)
