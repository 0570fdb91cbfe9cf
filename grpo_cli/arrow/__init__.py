"""Arrow columns: column references, and group keys to dense IDs."""
