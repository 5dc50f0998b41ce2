"""Results as tables, projected days and dollars, reports and exports (not built yet: the store in search/store.py holds the data)."""
