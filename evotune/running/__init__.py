"""Running an experiment: the session that owns a run, the tuning loop, the schedule, the confirmation
stage, the policies over the session (`run`, `record`), and `record --compile-only`, which measures nothing."""
