"""The atlas: a database of measured training configurations that ships with trainscout and grows.

The project's own H200 measurements ship read-only in records.jsonl.gz (schema: store/row_format.py; built by
bench/build_atlas.py from bench/data); results stores and contribution files are layered on top (atlas/db.py).
`trainscout lookup` answers from it (atlas/lookup.py), with predictions for what was never measured
(atlas/predict.py); `trainscout atlas` draws it as one HTML page (atlas/page.py).
"""
