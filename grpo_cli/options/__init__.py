"""The options, each declared on the field it sets: the advantage options and presets, a run's
configuration, the checks, the command's own options, and their catalogue."""
