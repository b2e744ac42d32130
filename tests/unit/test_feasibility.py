"""orchestrator/formulas/feasibility.py against a brute force over every placement of the bundles."""

import itertools

from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator.formulas.feasibility import STRATEGIES, Shape, fits, nearest, node_groups, problem


def brute_force(shape: Shape, nodes) -> bool:
    """Try every node for every bundle and for the trial's actor."""
    n = len(nodes)
    for placement in itertools.product(range(n), repeat=shape.workers):
        if shape.strategy == "STRICT_PACK" and len(set(placement)) > 1:
            continue
        if shape.strategy == "STRICT_SPREAD" and len(set(placement)) < len(placement):
            continue
        for trial_node in range(n):
            used = [dict.fromkeys(("CPU", "GPU"), 0.0) for _ in nodes]
            for node in placement:
                for k, v in shape.per_worker.items():
                    used[node][k] += v
            for k, v in shape.trial.items():
                used[trial_node][k] += v
            if all(used[i][k] <= nodes[i].get(k, 0.0) + 1e-9 for i in range(n) for k in used[i]):
                return True
    return False


halves = st.integers(0, 8).map(lambda x: x / 2)
nodes_st = st.lists(st.fixed_dictionaries({"CPU": halves, "GPU": st.integers(0, 2).map(float)}), min_size=1, max_size=3)
shape_st = st.builds(
    Shape,
    workers=st.integers(1, 4),
    per_worker=st.fixed_dictionaries(
        {"CPU": st.sampled_from([0.5, 1.0, 1.5, 2.0]), "GPU": st.sampled_from([0.0, 1.0])}
    ),
    strategy=st.sampled_from(STRATEGIES),
    trial=st.sampled_from([{}, {"CPU": 0.2}, {"CPU": 1.0}]),
)


@settings(max_examples=400, deadline=None)
@given(shape_st, nodes_st)
def test_fits_agrees_with_brute_force(shape, nodes):
    assert fits(shape, nodes) == brute_force(shape, nodes)


@settings(max_examples=150, deadline=None)
@given(shape_st, nodes_st)
def test_every_suggestion_fits_and_changes_one_thing(shape, nodes):
    if fits(shape, nodes):
        assert problem(shape, nodes, "the cluster") is None
        return
    for override in nearest(shape, nodes):
        key, value = override.split("=")
        changed = (
            Shape(int(value), shape.per_worker, shape.strategy, shape.trial)
            if key == "cluster.num_workers"
            else Shape(shape.workers, {**shape.per_worker, "CPU": float(value)}, shape.strategy, shape.trial)
        )
        assert brute_force(changed, nodes), override
        if key == "cluster.num_workers":  # the largest D that fits
            assert not brute_force(Shape(int(value) + 1, shape.per_worker, shape.strategy, shape.trial), nodes)
        else:  # within 0.01 of the largest CPUs per worker that fits
            assert not brute_force(
                Shape(shape.workers, {**shape.per_worker, "CPU": float(value) + 0.01}, shape.strategy, shape.trial),
                nodes,
            )


def test_the_issue_s_cluster_sweep_needs_a_bit_more_than_two_nodes():
    two_nodes = [{"CPU": 0.0}, {"CPU": 32.0, "GPU": 4.0}, {"CPU": 32.0, "GPU": 4.0}]  # head with num-cpus 0
    eight_by_eight = Shape(8, {"CPU": 8.0, "GPU": 1.0}, "PACK", {"CPU": 0.2})
    line = problem(eight_by_eight, two_nodes, "the cluster")
    assert line and "8 x {CPU: 8, GPU: 1} (PACK) + {CPU: 0.2} for the trial" in line
    assert "cluster.cpus_per_worker=7.95" in line and "cluster.num_workers=7" in line
    assert fits(Shape(8, {"CPU": 7.0, "GPU": 1.0}, "PACK", {"CPU": 0.2}), two_nodes)


def test_autoscaling_groups_add_the_nodes_they_may_still_start():
    head, gpu = {"CPU": 4.0}, {"CPU": 32.0, "GPU": 4.0}
    shape = Shape(12, {"CPU": 8.0, "GPU": 1.0})
    assert not fits(shape, node_groups([head, gpu], []))
    assert len(node_groups([head, gpu], [(gpu, 3)])) == 4  # one of the group's 3 is up already
    assert fits(shape, node_groups([head, gpu], [(gpu, 3)]))
    assert not fits(Shape(13, {"CPU": 8.0, "GPU": 1.0}), node_groups([head, gpu], [(gpu, 3)]))
    assert fits(Shape(40, {"CPU": 8.0, "GPU": 1.0}), node_groups([head], [(gpu, -1)]))  # unbounded group


def test_fractional_gpus_let_small_trials_share_a_gpu():
    from orchestrator.core import config, derived
    from tests.conftest import TINY

    half = config.load(TINY, ["cluster.use_gpu=true", "cluster.gpus_per_worker=0.5", "cluster.cpus_per_worker=1"])
    one_gpu_node = [{"CPU": 4.0, "GPU": 1.0}]
    assert derived.worker_resources(half) == {"CPU": 1.0, "GPU": 0.5}
    two_trials = Shape(2, derived.worker_resources(half), "STRICT_PACK")  # what two such trials hold
    assert fits(two_trials, one_gpu_node)
    whole = config.load(TINY, ["cluster.use_gpu=true", "cluster.cpus_per_worker=1"])
    assert not fits(Shape(2, derived.worker_resources(whole), "STRICT_PACK"), one_gpu_node)


def test_the_formula_takes_plain_numbers_and_the_core_reads_the_config():
    """formulas/feasibility knows no config: a bundle from a worker's CPUs and GPUs (none: no GPU
    key); core/derived reads the cluster section into it and into a run's shape."""
    from orchestrator.core import config, derived
    from orchestrator.formulas import feasibility
    from tests.conftest import TINY

    assert feasibility.bundle(8.0, 1.0) == {"CPU": 8.0, "GPU": 1.0}
    assert feasibility.bundle(2.0) == feasibility.bundle(2.0, 0.0) == {"CPU": 2.0}
    cpu = config.load(TINY, ["cluster.cpus_per_worker=2", "cluster.num_workers=2", "cluster.placement_strategy=SPREAD"])
    assert derived.worker_resources(cpu) == {"CPU": 2.0}
    assert derived.shape_of(cpu) == Shape(2, {"CPU": 2.0}, "SPREAD", {})
    assert derived.shape_of(cpu, trial={"CPU": 0.2}) == Shape(2, {"CPU": 2.0}, "SPREAD", {"CPU": 0.2})
