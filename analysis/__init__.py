"""Results as pandas tables (table.py) and exports that tools load unmodified (export.py)."""
