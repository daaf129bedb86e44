"""Test helpers shipped with gcs (import submodules explicitly; nothing heavy here)."""
