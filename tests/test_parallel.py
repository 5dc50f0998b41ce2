"""The mesh (spaces/parallel.py): degrees read from the knobs' mesh_dim, the data-parallel ranks computed in one place,
the ranks' coordinates, and a record from before Plan.mesh existed."""
import pytest

from trainscout.spaces import ConfigError, Context, ParallelDims, Plan, resolve
from trainscout.spaces.parallel import data_parallel_ranks, degrees


def test_pipeline_stages_is_a_mesh_dimension_and_resolve_writes_it():
    cfg, plan = resolve({"pipeline_stages": 2, "micro_batch_size": 1},
                        Context(world_size=4, num_layers=4, global_batch=8))
    assert degrees(cfg) == {"pp": 2} and plan.mesh == {"pp": 2}
    dims = ParallelDims.of(plan, 4)
    assert (dims.dp, dims.replicas, dims.names, dims.shape) == (2, 2, ("dp", "pp"), (2, 2))
    # the pipeline innermost: ranks 0, 1 are the two stages of replica 0 and read its sequences
    assert [dims.data_rank(r) for r in range(4)] == [0, 0, 1, 1]
    assert Context(world_size=4).data_parallel_ranks(cfg) == 2
    _, plain = resolve({}, Context(world_size=4, num_layers=4, global_batch=8))
    assert plain.mesh == {} and ParallelDims.of(plain, 4).trivial and ParallelDims.of(plain, 4).dp == 4


def test_dims_order_coordinates_and_the_data_ranks():
    dims = ParallelDims(world=16, degrees={"pp": 2, "cp": 2, "tp": 2})
    assert dims.dp == 2 and dims.replicas == 4  # data x context ranks average the gradients
    assert dims.coords(13) == {"dp": 1, "pp": 1, "cp": 0, "tp": 1}  # row-major: tp varies fastest
    assert data_parallel_ranks(16, {"pp": 2, "tp": 2}) == 4
    with pytest.raises(ValueError, match="do not divide"):
        ParallelDims(world=6, degrees={"tp": 4})


def test_a_record_without_a_mesh_takes_its_pipeline_stages():
    old = {"engine": "pipeline", "pipeline": {"stages": 2, "schedule": "1f1b", "chunks": 1, "microbatches": 4}}
    assert ParallelDims.of(Plan.from_dict(old), 4).degrees == {"pp": 2}  # a plan stored before Plan.mesh


def test_degrees_that_do_not_divide_the_ranks_are_refused():
    with pytest.raises(ConfigError, match="pipeline_stages=4 does not divide the 6 ranks"):
        resolve({"pipeline_stages": 4}, Context(world_size=6, num_layers=8, global_batch=12))
