"""A run's plan, reward columns to tensors, pass 1's per-group figures, and progress."""
