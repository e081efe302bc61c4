"""The report stage: JSONL, CSV and markdown reports."""
