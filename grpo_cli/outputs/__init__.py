"""What a run writes: outputs, the write guard, and Parquet splicing."""
