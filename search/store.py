"""The results store moved to trainscout.store; this name stays for scripts that still import it from here
(bench/trial_gpu.py)."""
from trainscout.store import DETERMINISTIC, Store, default_url, measurement_key, now, open_store  # noqa: F401
