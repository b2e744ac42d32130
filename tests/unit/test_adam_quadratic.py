"""Is the noise scale of the gradient as AdamW preconditions it (gns/b_simple_adam) closer than
B_simple to AdamW's critical batch size? On a noisy quadratic with a Hessian of condition number
100 (tests/adam_quadratic.py; the full study is benchmarks/adam_quadratic_bcrit.py, figures in
docs/benchmarks.md): no. AdamW's critical batch size lies well below both, and B_simple_adam is
the farther of the two, at the target and averaged along the runs. This test holds that finding
on a smaller simulation (16 seeds, 5 batch sizes): a change that made B_simple_adam the better
signal would fail it, and docs/critical-batch.md ("Which noise scale to trust for Adam") with it."""

from __future__ import annotations

import math

from tests.adam_quadratic import AdamQuadratic, compare

WORLD = AdamQuadratic(noise=2.0, target=0.001, distance=4.0, lr_low=3e-3, lr_per_octave=3, seeds=16, max_steps=4000)
BATCHES = [2.0, 8.0, 32.0, 128.0, 512.0]


def test_b_simple_adam_is_not_closer_than_b_simple_to_adamws_critical_batch_size():
    c = compare(WORLD, BATCHES)
    steps = [r.steps for r in c.runs]
    print(
        f"steps {steps}; B_crit {c.b_crit:.1f}, S_min {c.s_min:.1f}; "
        f"at the target B_simple {c.median('b_simple'):.0f}, B_simple_adam {c.median('b_simple_adam'):.0f}; "
        f"along B_simple {c.median('b_simple', 'along'):.0f}, B_simple_adam {c.median('b_simple_adam', 'along'):.0f}"
    )
    # The premises: the best lrs are inside the grid, B_crit inside the batch sizes, and the
    # fewest steps well past AdamW's memory of 1 / (1 - beta2) = 20 steps (not its start-up).
    assert not any(r.at_edge for r in c.runs)
    assert BATCHES[0] < c.b_crit < BATCHES[-1] and c.s_min > 2 / (1 - WORLD.beta2)
    for where in ("at_target", "along"):
        simple, adam = (abs(math.log(c.ratio(k, where))) for k in ("b_simple", "b_simple_adam"))
        assert adam > simple, f"{where}: B_simple_adam is the closer one"
    assert c.ratio("b_simple") > 3 and c.ratio("b_simple_adam") > 3, "at the target both lie well above B_crit"
