"""Managers own the GCS state: validate -> persist -> apply in memory -> publish -> reply."""
