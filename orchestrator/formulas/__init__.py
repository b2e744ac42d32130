"""Pure arithmetic on plain numbers, one place per formula: batch decomposition and learning-rate
scaling, schedules, the noise scale, memory, cost, cluster feasibility; and the error of this floor
(errors.ConfigError, which the core re-exports). The lowest floor: it imports no other room
(docs/design.md 2)."""
