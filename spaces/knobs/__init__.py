"""Built-in knobs: one file each, registered on import."""
