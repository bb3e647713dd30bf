"""The backend probe (`inv probe-backends`): candidates, runs on a host, the table, the inventory write-back."""
