"""Parallel layouts of the video DiT equal the single-device model: real processes over gloo."""

from __future__ import annotations

import pytest
from vfm_testmedia import layouts_by_world, parallel_equality_worker

from train.parallel_dims import ParallelDims

# Uneven splits also add absolute positions: each rank must embed its own tokens' coordinates.
ABSOLUTE = {"absolute_positions": True}
LAYOUTS = {
    "cp2_ulysses": (2, {"cp": 2}),
    "cp2_ulysses_uneven": (2, {"cp": 2, "thw": (3, 6, 10), "model": ABSOLUTE}),  # 45 tokens: padded and masked
    "tp2": (2, {"tp": 2}),
    "tp2_sequence_parallel_uneven": (2, {"tp": 2, "sp": True, "thw": (3, 6, 10), "model": ABSOLUTE}),  # 45 in 23s
    "cp2_tp2_sequence_parallel": (4, {"cp": 2, "tp": 2, "sp": True, "thw": (3, 6, 10)}),
    "tp2_sequence_parallel_checkpointed": (2, {"tp": 2, "sp": True, "ac": True}),
    "dp_shard2": (2, {"dp_shard": 2}),
    "cp2_tp2": (4, {"cp": 2, "tp": 2}),
    "cp4_ulysses_uneven": (4, {"cp": 4, "thw": (1, 6, 6)}),  # 9 tokens over 4 ranks
    "cp2_ring": (2, {"cp": 2, "cp_kind": "ring"}),
    "cp2_ring_uneven": (2, {"cp": 2, "cp_kind": "ring", "thw": (3, 6, 10), "model": ABSOLUTE}),
    "cp4_hybrid": (4, {"cp": 4, "cp_kind": "hybrid", "thw": (3, 6, 10), "model": ABSOLUTE}),  # Ulysses pairs, ring
    "cp2_ring_checkpointed": (2, {"cp": 2, "cp_kind": "ring", "ac": True}),  # recompute runs the ring again
    "dp_replicate2_dp_shard2": (4, {"dp_replicate": 2, "dp_shard": 2}),  # HSDP
}


@pytest.fixture(scope="module")
def results_by_world(tmp_path_factory):
    """Each world size's layouts, run in one process group on first use."""
    return layouts_by_world(parallel_equality_worker, LAYOUTS, tmp_path_factory)


@pytest.mark.parametrize("name", list(LAYOUTS))
def test_parallel_forward_gradients_and_20_step_loss_curve_equal_one_device(name, results_by_world):
    world, _ = LAYOUTS[name]
    by_rank = [ranks[name] for ranks in results_by_world(world)]
    for rank, result in enumerate(by_rank):
        assert result["out"] <= 1e-5, (rank, result["out"])
        worst = max(result["grads"].items(), key=lambda kv: kv[1])
        assert worst[1] <= 1e-5, (rank, worst)
        assert len(result["grads"]) > 30
        ref, par = result["curve_ref"], result["curve_par"]
        assert len(ref) == 20 and ref[-1] < ref[0]  # it trains
        for a, b in zip(ref, par, strict=True):
            assert abs(a - b) <= 1e-5 * max(1.0, abs(a)), (rank, a, b)


def test_layouts_that_cannot_work_fail_with_what_to_change():
    with pytest.raises(ValueError, match="world size is 4"):
        ParallelDims(1, 1, 2, 1, 4)
    with pytest.raises(ValueError, match="every degree"):
        ParallelDims(1, 0, 2, 2, 4)
    with pytest.raises(ValueError, match="cp_kind"):
        ParallelDims(1, 1, 2, 1, 2, "star")
    with pytest.raises(ValueError, match="even cp >= 4"):
        ParallelDims(1, 1, 2, 1, 2, "hybrid")
    with pytest.raises(ValueError, match="does not divide by parallel.tp=3"):
        ParallelDims(1, 1, 1, 3, 3).check_model(num_heads=4)
    with pytest.raises(ValueError, match="tp x Ulysses degree = 2 x 4"):
        ParallelDims(1, 1, 4, 2, 8).check_model(num_heads=4)
    dims = ParallelDims(1, 1, 4, 2, 8, "hybrid")
    assert (dims.dp, dims.ulysses, dims.ring) == (1, 2, 2)
    dims.check_model(num_heads=4)
    dims = ParallelDims(2, 2, 2, 1, 8)
    assert (dims.dp, dims.ulysses, dims.ring) == (4, 2, 1)
