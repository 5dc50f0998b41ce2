"""A measurement's MFU as the atlas reads it: defined in trial/mfu.py (the store's contribution checks read it too,
and the store is below the atlas), re-exported here under its old name."""
from trainscout.trial.mfu import CLAIMED, CONVENTION, mfu

__all__ = ["CLAIMED", "CONVENTION", "mfu"]
