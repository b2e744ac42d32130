"""Pure arithmetic, one place per formula: batch decomposition and learning-rate scaling,
schedules, the noise scale, memory, cost, cluster feasibility."""
