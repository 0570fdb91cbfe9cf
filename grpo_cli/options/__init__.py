"""The option vocabulary, the option table, the advantage options and presets, and a run's configuration."""
