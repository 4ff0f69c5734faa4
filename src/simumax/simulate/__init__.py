"""Event simulation: schedule task lists + per-pass costs -> a timeline per pipeline rank."""
