"""Trainers' rollout dumps (--from) and their own no-signal rules (--trainer-filter)."""
