"""Data: checksummed JSONL files, the synthetic task, a sweep's data folder (prepare), prompt templates and answer
scoring (rewards and eval)."""
