"""Training: the RL core (pure GRPO math), what the arms differ in, the loop, checkpoints,
multi-process helpers and FSDP sharding."""
