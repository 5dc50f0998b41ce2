"""Measure one training configuration for real, in fresh worker processes started through Ray."""
from .runner import STATUSES, execute, prepare, run_trial

__all__ = ["STATUSES", "execute", "prepare", "run_trial"]
