"""Results as pandas tables (table.py) and exports that tools load unmodified (export.py)."""


def load(source):
    """A store (a search's --out folder or a storage URL) as a pandas DataFrame: one row per trial, or one per
    measurement for a store without searches, with the micro-batch and accumulation each ran, status, error (why it
    failed), GPU-seconds and metrics (analysis.table.load_resolved)."""
    from .table import load_resolved  # pandas and the store load on first use, not on import
    return load_resolved(source)


__all__ = ["load"]
