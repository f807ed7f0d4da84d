"""Running an experiment: the session that owns a run, the tuning loop, the schedule, the confirmation
stage, and the policies over the session (`run`, `record`, `record --compile-only`)."""
