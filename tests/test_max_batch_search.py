"""The max-batch search reports whether memory bound it or its search limit stopped it."""

from __future__ import annotations

from cases import training_chain

from checkmate.analysis.max_batch import MAX_SEARCH_BATCH, max_batch_size


def family(bytes_per_sample: int):
    """Training chains whose node memory grows by ``bytes_per_sample`` per sample."""
    return lambda b: training_chain(4, mem=1 + bytes_per_sample * b, name=f"chain-b{b}")


def test_memory_binds_before_the_limit():
    res = max_batch_size(family(10), 10_000, "checkpoint_all")
    assert 0 < res.max_batch_size < MAX_SEARCH_BATCH and not res.search_limit_reached
    assert not max_batch_size(family(10), 10_000, "checkpoint_all", max_batch=1000).search_limit_reached


def test_a_search_stopped_by_its_limit_says_so():
    # memory that does not grow with the batch never binds: the result is the limit, flagged
    res = max_batch_size(family(0), 10_000, "checkpoint_all", max_batch=100)
    assert res.max_batch_size == 100 and res.search_limit_reached and res.search_limit == 100
    assert res.to_json_dict()["search_limit_reached"] is True
    # a bound that is not a power of two is probed itself
    assert max_batch_size(family(0), 10_000, "checkpoint_all", max_batch=64).max_batch_size == 64
