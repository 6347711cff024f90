"""The validation report (`python -m stratacl.validate`): kernel and operator rows,
calibrate/check split."""
