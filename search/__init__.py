"""Search the knob space with real trials: Ray Tune schedules, Optuna samples, ASHA stops early, a SQL store
remembers."""
