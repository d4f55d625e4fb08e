"""Data: checksummed JSONL files, the synthetic task, prompt templates and answer scoring (rewards and eval)."""
