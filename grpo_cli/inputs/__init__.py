"""What a run reads: INPUTs resolved to shards, and one reader per format."""
