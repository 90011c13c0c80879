"""The built-in arithmetic world: problem generator, local tokenizer, warm-started models."""
