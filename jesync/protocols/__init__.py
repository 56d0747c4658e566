"""The wire protocols, one per module, all served over one LockService."""
