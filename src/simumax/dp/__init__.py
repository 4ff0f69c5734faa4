"""Data parallelism after the backward: gradient buckets and their collectives
(buckets.py), the optimizer step over the rank's shard (optimizer_step.py). Per-layer
ZeRO-2/3 collectives are ops (graph/sharding.py); model-state bytes are memory/model_states.py."""
