"""Pipeline schedules: closed-form 1F1B (and interleaved) timing and in-flight counts."""
